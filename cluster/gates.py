"""How a boot is judged good (a profile's ``gates``): timeouts, readiness, the smoke generation,
the boot log's gates and failure classes, clocks, and the preflight gates of issue #4.
``cluster.readiness``, ``cluster.teardown``, ``cluster.preflight`` and ``cluster.blame`` apply
them."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from knobs.vocabulary import FailureClass

DEFAULT_FAILURE_PATTERNS: dict[FailureClass, tuple[str, ...]] = {
    # another process holds a port the engine binds: the host's fault, never the config's
    # (vLLM and uvicorn print errno 98; llama.cpp its own line)
    "port_in_use": (
        r"address already in use",
        r"\[Errno 98\]",
        r"EADDRINUSE",
        r"couldn't bind HTTP server socket",
    ),
    # a node's disk full (a compile cache, downloaded weights, a log): the node's, not the
    # config's (errno 28; a quota's errno 122)
    "disk_full": (
        r"No space left on device",
        r"\[Errno 28\]",
        r"\bENOSPC\b",
        r"Disk quota exceeded",
    ),
    "oom": (r"out of memory", r"OutOfMemoryError", r"CUDA error: out of memory"),
    # vLLM, when the memory fraction leaves too little for the KV cache of one request
    "kv_capacity": (
        r"more KV cache memory is needed than the available",
        r"No available memory for the cache blocks",
        r"larger than the available KV cache memory",
    ),
    # a node's GPU or its driver, not the config: memory that failed its ECC, a GPU gone
    # from the bus, a driver upgraded under a running system (NVML's library no longer the
    # kernel module's until a reboot), or every device held by another process. After the
    # config's own classes: a log that names an OOM as well failed of the OOM
    "gpu_fault": (
        r"uncorrectable ECC error",
        r"fallen off the bus",
        r"NVRM: Xid",
        r"Driver/library version mismatch",
        r"NVML/RM version mismatch",
        r"unsupported display driver / cuda driver combination",
        r"CUDA driver version is insufficient",
        r"CUDA-capable devices are busy or unavailable",
    ),
    # a node that could not reach the network its engine downloads from (a model or adapter
    # not yet in its cache, the hub or the DNS away for the night): the node's, never the
    # value's; the hub that answers "not found" is the config's and named by none of these.
    # After the config's own classes: an engine that got as far as an OOM had its weights, and
    # an air-gapped node's warnings about the hub must not pass a config's failure off
    "network": (
        # transformers and huggingface_hub, once a file is neither reachable nor cached; not
        # their connection errors themselves, which a node that serves from its cache logs as
        # warnings on its way up
        r"We couldn't connect to '?https?://[^ ]* to load",
        r"LocalEntryNotFoundError",
        r"cannot find the requested files in the local cache",
        r"check your (?:internet )?connection and try again",
    ),
    "worker_missing": (
        r"timed out waiting for .*worker",
        r"rendezvous .*timed out",
        r"lost .*worker",
        # issue #4: what a head prints when a rank never joined or went away
        r"timed out .*waiting for node rank",
        r"NCCL error: remote process exited",
        # issue #17: a worker that found another cluster's head on its master port
        r"rendezvous token does not match",
    ),
}


class GateSpec(BaseModel):
    """How a boot is judged good: timeouts, readiness, smoke generation, log gates, clocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    boot_timeout_s: float = Field(default=120.0, gt=0)
    stall_s: float | None = Field(
        default=None,
        gt=0,
        description="no new head log output for this long while not healthy: wedge",
    )
    poll_s: float = Field(default=0.25, gt=0)
    worker_ready_line: str | None = Field(
        default=None, description="regex a worker's log prints once it is up"
    )
    worker_ready_timeout_s: float = Field(default=30.0, gt=0)
    stop_grace_s: float = Field(default=10.0, gt=0)
    health_path: str = Field(
        default="/health",
        description="the path the head answers 200 on once it is ready (a leading /, e.g. /health)",
    )
    smoke_prompt: str = "The capital of France is"
    smoke_max_tokens: int = Field(default=8, ge=1, le=256)
    must_log: tuple[str, ...] = Field(
        default=(), description="regexes the head's (node-0's) boot log must have, each"
    )
    must_not_log: tuple[str, ...] = Field(
        default=(), description="regexes no node's boot log may have"
    )
    failure_patterns: dict[FailureClass, tuple[str, ...]] = Field(
        default_factory=lambda: dict(DEFAULT_FAILURE_PATTERNS)
    )
    clocks_command: tuple[str, ...] | None = Field(
        default=None, description="argv printing JSON {sm_clock_mhz, matmul_rate} on a node"
    )
    min_matmul_rate: float = Field(default=0.9, gt=0)
    recover_command: tuple[str, ...] | None = Field(
        default=None, description="argv that power-cycles a node whose clocks are stuck"
    )
    # --- issue #4: preflight gates and container stops ---------------------------------------
    interface: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.:{}-]{1,64}$",
        description="the cluster interface (placeholders allowed): each node's host address "
        "must be on it before anything starts, or the node is the wrong rank",
    )
    memory_settle_s: float | None = Field(
        default=None,
        ge=0.05,
        description="free memory is sampled this far apart; it has settled once two samples "
        "differ by at most memory_settle_mib (a stopped engine frees unified memory slowly)",
    )
    memory_settle_mib: float = Field(default=512.0, gt=0)
    memory_settle_timeout_s: float = Field(default=120.0, gt=0)
    min_free_mib: float | None = Field(
        default=None, gt=0, description="settled free memory below this fails the gate"
    )
    worker_follows_head: tuple[str, ...] = Field(
        default=(r"[Mm]aster shut down", r"lost the connection to master"),
        description="regexes of the lines a worker prints when it exits because the head went "
        "away: such a worker is not blamed for a failed boot",
    )
    stop_hook: tuple[str, ...] | None = Field(
        default=None,
        description="argv run on a node before its engine's process group is stopped, e.g. "
        "`docker stop -t 30 NAME` for an engine in a container; its exit status is recorded, "
        "the process-group stop that follows confirms the engine is gone",
    )

    @field_validator("health_path")
    @classmethod
    def _a_path(cls, given: str) -> str:
        """The readiness path is a URL path on the head's port, checked before any boot."""
        if not re.fullmatch(r"/[A-Za-z0-9_./~%=&?+-]*", given):
            raise ValueError(
                f"{given!r} is not a URL path on the head's port: start it with / (e.g. "
                "/health), without spaces or a host"
            )
        return given

    @field_validator("worker_ready_line")
    @classmethod
    def _one_regex(cls, given: str | None) -> str | None:
        """A worker's ready line compiles when the profile loads, not after a boot."""
        if given is not None:
            _compiled(given)
        return given

    @field_validator("must_log", "must_not_log", "worker_follows_head")
    @classmethod
    def _regexes(cls, given: tuple[str, ...]) -> tuple[str, ...]:
        """Every log gate compiles when the profile loads: a pattern that does not is found
        before the first boot of the night, not after it."""
        for pattern in given:
            _compiled(pattern)
        return given

    @field_validator("failure_patterns")
    @classmethod
    def _defaults_kept(
        cls, given: dict[FailureClass, tuple[str, ...]]
    ) -> dict[FailureClass, tuple[str, ...]]:
        """A profile's patterns replace the defaults class by class, never all of them: one
        that names its own OOM lines still tells a port clash (which must never bar a value)
        and a missing worker. Each pattern compiles when the profile loads."""
        for patterns in given.values():
            for pattern in patterns:
                _compiled(pattern)
        return {**DEFAULT_FAILURE_PATTERNS, **given}


def _compiled(pattern: str) -> re.Pattern[str]:
    """``pattern`` compiled, or a ValueError that shows it and says what is wrong."""
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(
            f"{pattern!r} is not a regular expression ({e}); "
            "escape a literal ( [ . * + ? with a backslash"
        ) from None
