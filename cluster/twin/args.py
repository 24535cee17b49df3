"""The ``vllm serve`` command line the twin accepts, parsed the way vLLM's argparse does.

Unknown or malformed flags end the process with argparse's usage message on stderr and exit
status 2, as ``vllm serve`` does. Flags the twin has no model for are accepted and ignored
(they are part of real launchers); the ones that matter map back to the catalog's knob names.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from knobs.spec import Value

_KV_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
_BACKENDS = ("mp", "ray", "uni", "external_launcher")


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not valid JSON: {e.msg}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON object")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid float value: {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text} must be in (0, 1]")
    return value


def _human_int(text: str) -> int:
    """vLLM's ``--max-model-len`` also takes ``128k`` / ``1m``."""
    match = re.fullmatch(r"(\d+)([kKmM]?)", text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}")
    number, unit = int(match.group(1)), match.group(2).lower()
    return number * {"": 1, "k": 1024, "m": 1024 * 1024}[unit]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be a positive integer")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a TCP port")
    return value


def parser() -> argparse.ArgumentParser:
    """The ``vllm serve`` parser (the subset of flags our launchers render, and a few more)."""
    p = argparse.ArgumentParser(
        prog="vllm serve",
        description="Start the vLLM OpenAI-compatible server (orchestrate twin engine).",
        allow_abbrev=False,
    )
    p.add_argument("model", help="model path or name")
    p.add_argument("--served-model-name", nargs="+", default=None)
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=_port, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=_positive_int, default=1)
    p.add_argument("--nnodes", type=_positive_int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=_port, default=29501)
    p.add_argument("--headless", action="store_true")
    p.add_argument("--distributed-executor-backend", choices=_BACKENDS, default=None)
    p.add_argument("--speculative-config", type=_json_object, default=None)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=None)
    p.add_argument("--max-num-seqs", type=_positive_int, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--kv-cache-dtype", choices=_KV_DTYPES, default=None)
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=None)
    p.add_argument("--block-size", type=_positive_int, default=None)
    p.add_argument("--max-model-len", type=_human_int, default=None)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--moe-backend", default=None)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--quantization", "-q", default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--disable-log-requests", action="store_true")
    p.add_argument("--enable-log-requests", action="store_true")
    p.add_argument("--disable-log-stats", action="store_true")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    return p


@dataclass(frozen=True)
class ServeArgs:
    """A parsed ``vllm serve`` command line."""

    model: str
    served_model_name: str
    host: str
    port: int
    tensor_parallel_size: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    headless: bool
    speculative: dict[str, Any] | None
    max_num_batched_tokens: int | None
    enforce_eager: bool
    kv_cache_dtype: str | None
    gpu_memory_utilization: float | None
    max_model_len: int | None
    argv: tuple[str, ...]
    non_default: dict[str, Any]
    #: each completion request logged, as vLLM does with --enable-log-requests
    log_requests: bool = False

    @property
    def num_speculative_tokens(self) -> int:
        """K from ``--speculative-config`` (0 without speculative decoding)."""
        if not self.speculative:
            return 0
        return int(self.speculative.get("num_speculative_tokens", 0))

    @property
    def drafter_dir(self) -> Path | None:
        """The drafter directory named by ``--speculative-config``'s ``model``."""
        if not self.speculative or not self.speculative.get("model"):
            return None
        return Path(str(self.speculative["model"]))


def parse(argv: list[str]) -> ServeArgs:
    """Parse a ``vllm serve`` command line.

    Raises:
        SystemExit: status 2 with argparse's usage message on stderr for an unknown flag, a
            malformed value, or a ``--speculative-config`` that is not a JSON object with a
            positive integer ``num_speculative_tokens`` (as vLLM's parser would refuse it).
    """
    p = parser()
    ns = p.parse_args(argv)
    spec = ns.speculative_config
    if spec is not None:
        k = spec.get("num_speculative_tokens")
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            p.error(
                "argument --speculative-config: num_speculative_tokens must be a positive "
                f"integer, not {k!r}"
            )
        if "model" in spec and not isinstance(spec["model"], str):
            p.error("argument --speculative-config: model must be a path string")
    if not 0 <= ns.node_rank < ns.nnodes:
        p.error(f"argument --node-rank: {ns.node_rank} is not in [0, --nnodes {ns.nnodes})")
    defaults = vars(p.parse_args([ns.model]))
    non_default = {k: v for k, v in vars(ns).items() if defaults.get(k) != v}
    names = ns.served_model_name or [ns.model]
    return ServeArgs(
        model=ns.model,
        served_model_name=names[0],
        host=ns.host or "0.0.0.0",  # noqa: S104 - vLLM listens on every interface by default
        port=ns.port,
        tensor_parallel_size=ns.tensor_parallel_size,
        nnodes=ns.nnodes,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=ns.master_port,
        headless=ns.headless,
        speculative=spec,
        max_num_batched_tokens=ns.max_num_batched_tokens,
        enforce_eager=ns.enforce_eager,
        kv_cache_dtype=ns.kv_cache_dtype,
        gpu_memory_utilization=ns.gpu_memory_utilization,
        max_model_len=ns.max_model_len,
        argv=tuple(argv),
        non_default=non_default,
        log_requests=ns.enable_log_requests,
    )


def drafter_rank(directory: Path) -> int:
    """The adapter rank of a drafter directory.

    ``config.json``'s ``adapter_rank`` when present; else a ``-r<N>`` suffix of the directory
    name (``dflash2-r64`` → 64); else 0, the stock drafter (``dflash2-stock``).
    """
    config = directory / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        data = None
    if isinstance(data, dict):
        rank = data.get("adapter_rank")
        if isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0:
            return rank
    match = re.search(r"-r(\d+)$", directory.name)
    return int(match.group(1)) if match else 0


def config_of(args: ServeArgs, defaults: dict[str, Value]) -> dict[str, Value]:
    """The catalog knobs a command line sets; ``defaults`` fills the flags it leaves out."""
    drafter = args.drafter_dir
    return {
        "num_speculative_tokens": args.num_speculative_tokens,
        "max_num_batched_tokens": args.max_num_batched_tokens
        or int(defaults["max_num_batched_tokens"]),
        "cuda_graphs": not args.enforce_eager,
        "drafter_adapter_rank": drafter_rank(drafter) if drafter is not None else 0,
        "kv_cache_dtype": args.kv_cache_dtype or str(defaults["kv_cache_dtype"]),
        "gpu_memory_utilization": args.gpu_memory_utilization
        if args.gpu_memory_utilization is not None
        else float(defaults["gpu_memory_utilization"]),
    }
