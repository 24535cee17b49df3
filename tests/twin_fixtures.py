"""Helpers for the twin and bench tests: real engine processes on 127.0.0.1, free ports.

A ``TwinNode`` is one ``python -m cluster.twin serve`` process whose output a reader thread
collects line by line, so a test waits for a log line (or an exit) on a condition with a
deadline, never by sleeping. Every node is stopped when its ``running_nodes`` block (each test
module's fixture) ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

from cluster import stall
from cluster.stall import stalled
from cluster.twin import HEAD_READY_LINE, WORKER_READY_LINE, models_dir
from cluster.twin.landscape import landscape_path
from knobs.records import CellResultRecord
from tests.fixtures.ports import free_port

#: Boot this many times faster than the landscapes' own scale (a test boot takes ~0.1 s).
FAST_BOOT = "4000"


def spec_config(drafter: str | Path = "dflash2-r64", k: int = 7) -> str:
    """A ``--speculative-config`` JSON for a drafter of ``models_dir()`` (or a path)."""
    path = Path(drafter) if Path(drafter).is_absolute() else models_dir() / drafter
    return json.dumps({"method": "dflash", "model": str(path), "num_speculative_tokens": k})


def serve_argv(
    *,
    port: int | None = None,
    k: int = 7,
    drafter: str | Path = "dflash2-r64",
    eager: bool = True,
    mnbt: int = 7168,
    kv: str = "fp8_e4m3",
    memory: float = 0.85,
    extra: tuple[str, ...] = (),
) -> list[str]:
    """A ``vllm serve`` command line as the twin profile renders it (card 002's champion)."""
    argv = [
        "/models/glm53-flash",
        "--served-model-name",
        "glm53",
        "--speculative-config",
        spec_config(drafter, k),
        "--max-num-batched-tokens",
        str(mnbt),
        "--kv-cache-dtype",
        kv,
        "--gpu-memory-utilization",
        str(memory),
        "--block-size",
        "64",
        "--max-model-len",
        "262144",
        "--no-enable-prefix-caching",
        *(["--enforce-eager"] if eager else []),
        *extra,
    ]
    if port is not None:
        argv += ["--host", "127.0.0.1", "--port", str(port)]
    return argv


def write_landscape(
    directory: Path, base: str = "vllm-dflash2-tp4", **sections: dict[str, Any]
) -> Path:
    """A copy of shipped landscape ``base`` with ``sections`` merged in (one level deep)."""
    data: dict[str, Any] = yaml.safe_load(landscape_path(base).read_text())
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    data["name"] = f"{base}-test"
    path = directory / f"{base}-test.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class TwinNode:
    """One twin engine process; its output is collected line by line."""

    def __init__(self, argv: list[str], env: dict[str, str], name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cluster.twin", "serve", *argv],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with self.proc.stdout:
            for line in self.proc.stdout:
                with self._cond:
                    self.lines.append(line.rstrip("\n"))
                    self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    @property
    def log(self) -> str:
        """Everything the node printed so far."""
        with self._cond:
            return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 15.0) -> re.Match[str]:
        """The first log line matching ``pattern``, waiting for it up to ``timeout``."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self.lines[seen:]:
                    match = regex.search(line)
                    if match:
                        return match
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"{self.name}: no line matching {pattern!r} within {timeout}s; "
                        f"log:\n{self.log_unlocked()}"
                    )
                self._cond.wait(min(left, 0.5))

    def log_unlocked(self) -> str:
        return "\n".join(self.lines)

    def wait_exit(self, timeout: float = 15.0) -> int:
        """The exit status, waiting up to ``timeout`` for it."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the node's process."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL of the whole session if it lingers."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self._reader.join(timeout=5)


class TwinNodes:
    """Starts twin nodes for one test and stops all of them at its end."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.nodes: list[TwinNode] = []

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update({"TWIN_BOOT_SCALE": FAST_BOOT, "TWIN_NOISE": "0"})
        env.update(extra)
        return env

    def start(self, argv: list[str], name: str = "node", **env: str) -> TwinNode:
        env.setdefault("TWIN_NODE_DIR", str(self.tmp / name))
        node = TwinNode(argv, self.env(**env), name)
        self.nodes.append(node)
        return node

    def head(self, argv: list[str], **env: str) -> tuple[TwinNode, str]:
        """A single-node engine, booted: the node and its base URL."""
        port = free_port()
        node = self.start(
            [*argv, "--host", "127.0.0.1", "--port", str(port)], name=f"head-{port}", **env
        )
        node.wait_for(HEAD_READY_LINE)
        return node, f"http://127.0.0.1:{port}"

    def group(self) -> tuple[TwinNode, TwinNode, str]:
        """A tensor-parallel group of two nodes (a headless worker, then the head), booted and
        answering a greedy smoke: the head, the worker, and the head's base URL."""
        from cluster.bench import smoke

        master, port = free_port(), free_port()
        common: tuple[str, ...] = ("--nnodes", "2", "--master-addr", "127.0.0.1")
        common += ("--master-port", str(master), "--tensor-parallel-size", "2")
        worker = self.start(
            serve_argv(extra=(*common, "--node-rank", "1", "--headless")), name="worker"
        )
        worker.wait_for(WORKER_READY_LINE)
        head = self.start(serve_argv(port=port, extra=(*common, "--node-rank", "0")), name="head")
        head.wait_for(HEAD_READY_LINE)
        url = f"http://127.0.0.1:{port}"
        assert smoke(url, "glm53", timeout=30).strip()
        return head, worker, url

    def stop_all(self) -> None:
        for node in reversed(self.nodes):
            node.stop()


@contextlib.contextmanager
def running_nodes(tmp: Path) -> Iterator[TwinNodes]:
    """Twin engines started inside the block are all stopped when it ends (a test module's
    fixture wraps this)."""
    nodes = TwinNodes(tmp)
    try:
        yield nodes
    finally:
        nodes.stop_all()


def run_delay_s(pid: int, tid: int | None = None) -> float:
    """Seconds the process's threads (or the one thread ``tid``) have waited for a CPU while
    runnable: the kernel's ``run_delay`` (``/proc/<pid>/task/<tid>/schedstat``, field two), what
    a busy host, a CPU quota or a VM's stolen time took from them. Threads that have exited are
    not counted; 0.0 where the kernel keeps no such account."""
    tasks = Path(f"/proc/{pid}/task")
    paths = [tasks / str(tid)] if tid is not None else list(tasks.glob("*"))
    total = 0
    for path in paths:
        try:
            total += int((path / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


class HostWait:
    """How long this thread and the given processes waited for a CPU inside the block
    (``run_delay_s``). A measurement's tolerance on a shared machine is the idle machine's plus
    what its host can have taken from the window: the stall the record carries (late wake-ups,
    counted whole) and the waits the stall watch cannot see (each shorter than
    ``stall.LATE_S``; those that move tokens across the window are at its two edges)."""

    def __init__(self, *pids: int) -> None:
        self._who = [(os.getpid(), threading.get_native_id()), *((pid, None) for pid in pids)]
        self._start = 0.0
        self.waited_s = 0.0

    def _now(self) -> float:
        return sum(run_delay_s(pid, tid) for pid, tid in self._who)

    def __enter__(self) -> HostWait:
        self._start = self._now()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.waited_s = max(0.0, self._now() - self._start)

    def tolerance(self, idle: float, record: CellResultRecord) -> float:
        """``idle`` (a relative tolerance) plus the fractions of ``record``'s window that its
        stall and the unseen waits at its edges can have moved."""
        unseen = min(self.waited_s, 2 * stall.LATE_S)
        return idle + (stalled(record) + unseen) / record.duration


def health(url: str) -> int:
    """The status of ``GET /health``."""
    return httpx.get(url + "/health", timeout=5.0, trust_env=False).status_code


__all__ = [
    "FAST_BOOT",
    "HEAD_READY_LINE",
    "WORKER_READY_LINE",
    "HostWait",
    "TwinNode",
    "TwinNodes",
    "free_port",
    "health",
    "run_delay_s",
    "running_nodes",
    "serve_argv",
    "spec_config",
    "write_landscape",
]
