"""``serve``: one node of the twin, booting and failing the way a vLLM rank does.

Rank 0 serves HTTP from the start (``/health`` 503 while booting), waits for every headless
rank to join, then loads, compiles, profiles memory (an OOM or a too-small KV cache ends the
boot), captures graphs (or wedges, on stacks that declare it) and becomes healthy. Headless
ranks initialise, print ``WORKER_READY_LINE``, join the head and stay until it goes away.
Durations come from the landscape's boot section divided by its boot time scale.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from cluster.twin import args as serve_args
from cluster.twin import node, noise
from cluster.twin.engine import Engine
from cluster.twin.landscape import DEFAULT_LANDSCAPE, Landscape, load_landscape
from cluster.twin.log import EngineLog
from cluster.twin.physics import BootStatus, Settings
from cluster.twin.rendezvous import SILENT_S, Head, RendezvousError, follow, join
from cluster.twin.server import VLLM_VERSION, ServerState, start_server
from knobs.errors import KnobError
from orchestrator.errors import OrchestrateError, UsageError

#: Environment of the twin (the command line stays a real ``vllm serve`` command line).
ENV_LANDSCAPE = "TWIN_LANDSCAPE"
ENV_NODE_DIR = "TWIN_NODE_DIR"
ENV_SEED = "TWIN_SEED"
ENV_NOISE = "TWIN_NOISE"
ENV_BOOT_SCALE = "TWIN_BOOT_SCALE"
ENV_RUN_SCALE = "TWIN_RUN_SCALE"
#: the cluster's rendezvous token (issue #17): a head refuses a worker that brings another
ENV_TOKEN = "TWIN_RENDEZVOUS_TOKEN"  # noqa: S105 - the variable's name, not a secret

#: Wall-clock floors of the rendezvous waits, whatever the boot time scale: a host under load
#: must not turn a good start order into a failed one.
MIN_RENDEZVOUS_S = 1.0
MIN_WORKER_WAIT_S = 10.0


def rendezvous_window(landscape: Landscape) -> float:
    """Seconds rank 0 waits for its headless ranks (the scaled timeout, at least 1 s)."""
    return max(landscape.scaled(landscape.boot.rendezvous_timeout_s), MIN_RENDEZVOUS_S)


@dataclass(frozen=True)
class TwinEnv:
    """The twin-only settings, read from the environment."""

    landscape: Landscape
    node_dir: Path | None
    seed: int
    noise: bool
    token: str = ""


def _float_env(env: Mapping[str, str], name: str) -> float | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not a number") from None
    if value <= 0:
        raise UsageError(f"{name}={raw!r} must be positive")
    return value


def twin_env(env: Mapping[str, str]) -> TwinEnv:
    """The landscape (with the environment's overrides), node directory, seed and noise switch.

    Raises:
        ProfileError: the landscape does not load.
        UsageError: a malformed ``TWIN_SEED``, ``TWIN_NOISE`` or time-scale override.
    """
    landscape = load_landscape(env.get(ENV_LANDSCAPE) or DEFAULT_LANDSCAPE)
    boot, run = _float_env(env, ENV_BOOT_SCALE), _float_env(env, ENV_RUN_SCALE)
    if boot is not None or run is not None:
        landscape = landscape.with_time_scale(boot=boot, run=run)
    raw_seed = env.get(ENV_SEED, "0").strip() or "0"
    try:
        seed = int(raw_seed)
    except ValueError:
        raise UsageError(f"{ENV_SEED}={raw_seed!r} is not an integer") from None
    raw_noise = env.get(ENV_NOISE, "1").strip().lower() or "1"
    if raw_noise not in ("0", "1", "false", "true", "off", "on"):
        raise UsageError(f"{ENV_NOISE}={raw_noise!r} must be 0 or 1")
    quiet = raw_noise in ("0", "false", "off")
    if quiet:
        landscape = landscape.without_noise()
    return TwinEnv(
        landscape=landscape,
        node_dir=node.node_dir(env.get(ENV_NODE_DIR)),
        seed=seed,
        noise=not quiet,
        token=env.get(ENV_TOKEN, ""),
    )


class _Stop:
    """SIGTERM / SIGINT → a flag every wait polls (the engine exits in well under a second)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.fatal: str | None = None
        #: the signal that stopped the engine, if one did
        self.signum: int | None = None

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = self.signum or signum
        self.event.set()

    def die_of_signal(self) -> None:
        """After a clean shutdown on a signal, die of it (as uvicorn, and so vLLM's server,
        re-raises the signals it captured once it has shut down): whoever waits on the engine
        sees it killed by that signal, not exited 0."""
        if self.signum is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(self.signum, signal.SIG_DFL)
        signal.raise_signal(self.signum)

    def is_set(self) -> bool:
        return self.event.is_set() or self.fatal is not None

    def sleep(self, seconds: float) -> bool:
        """Wait ``seconds``; ``False`` when stopped (or failed) meanwhile."""
        deadline = time.monotonic() + seconds
        while not self.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            self.event.wait(min(left, 0.05))
        return False


def serve(argv: list[str], env: Mapping[str, str], stop: _Stop | None = None) -> int:
    """Run one node of the twin until SIGTERM, a failed boot, or a lost rank; the exit status
    (``stop``: the signals' flag, installed here).

    Raises:
        SystemExit: status 2 for a malformed command line (argparse's usage on stderr).
        UsageError, ProfileError: the twin's environment is malformed.
    """
    # wall clock, comparable across the nodes of a host or of an NTP-synchronised cluster: a
    # headless rank that started after rank 0 is refused, as vLLM's rendezvous fails then
    started_at = time.time()
    args = serve_args.parse(argv)
    tenv = twin_env(env)
    log = EngineLog()
    stop = stop or _Stop()
    stop.install()
    landscape = tenv.landscape
    state = node.load(tenv.node_dir)
    state.boots += 1
    rank = args.node_rank
    if (
        not state.stuck
        and tenv.noise
        and noise.stuck_at_boot(
            tenv.seed, rank, state.boots, landscape.noise.stuck_clock_probability
        )
    ):
        state.stuck, state.stuck_rate, state.stuck_since_boot = (
            True,
            landscape.noise.stuck_clock_rate,
            state.boots,
        )
    node.save(tenv.node_dir, state)

    log.info(
        "api_server.py:1885",
        f"vLLM API server version {VLLM_VERSION} (orchestrate twin, landscape {landscape.name})",
    )
    log.info("utils.py:328", f"non-default args: {args.non_default}")
    role = "headless" if args.headless else "head"
    log.info(
        "parallel_state.py:1164",
        f"Starting node rank {rank} of {args.nnodes} "
        f"(node_rank={rank}, nnodes={args.nnodes}, {role}, "
        f"pid={os.getpid()}, boot {state.boots})",
    )
    if state.stuck:
        log.warning(
            "platform.py:212", f"GPU SM clock {state.sm_clock_mhz:.0f} MHz is below nominal"
        )
    problem = _topology_problem(args, landscape)
    if problem:
        log.error("arg_utils.py:1412", f"ValueError: {problem}")
        return 1
    if args.headless:
        return _worker(args, tenv, state, stop, log, started_at)
    return _head(args, tenv, state, stop, log, started_at)


def _topology_problem(args: serve_args.ServeArgs, landscape: Landscape) -> str | None:
    if args.headless and args.node_rank == 0:
        return "--headless is for node ranks 1..nnodes-1; rank 0 serves the API"
    if not args.headless and args.node_rank > 0:
        return (
            f"node rank {args.node_rank} must be started with --headless "
            "(only rank 0 serves the API)"
        )
    devices = args.nnodes * landscape.topology.gpus_per_node
    if args.tensor_parallel_size > devices:
        return (
            f"tensor_parallel_size ({args.tensor_parallel_size}) is larger than the "
            f"{devices} GPU(s) of {args.nnodes} node(s)"
        )
    return None


def _fingerprint(args: serve_args.ServeArgs) -> str:
    """What every rank must agree on: the parsed command line without its per-rank flags."""
    per_rank = {"node_rank", "host", "port", "headless"}
    shared = {k: v for k, v in args.non_default.items() if k not in per_rank}
    shared["model"] = args.model
    text = json.dumps(shared, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _worker(
    args: serve_args.ServeArgs,
    tenv: TwinEnv,
    state: node.NodeState,
    stop: _Stop,
    log: EngineLog,
    started_at: float,
) -> int:
    landscape = tenv.landscape
    if not stop.sleep(landscape.scaled(landscape.boot.worker_init_s)):
        log.info("launcher.py:88", "Shutting down headless node (signal)")
        return 0
    host, port = args.master_addr, args.master_port
    log.info(
        "multiproc_executor.py:118",
        f"Headless node rank {args.node_rank} ready, waiting for master {host}:{port}",
    )
    hello = {
        "rank": args.node_rank,
        "nnodes": args.nnodes,
        "fingerprint": _fingerprint(args),
        "matmul_rate": state.matmul_rate,
        "sm_clock_mhz": state.sm_clock_mhz,
        "started_at": started_at,
        "token": tenv.token,
    }
    try:
        wait = max(landscape.scaled(landscape.boot.worker_wait_s), MIN_WORKER_WAIT_S)
        sock = join(host, port, hello, wait, stop.is_set)
    except RendezvousError as e:
        log.error("multiproc_executor.py:131", f"RuntimeError: {e}")
        return 1
    if sock is None:
        log.info("launcher.py:88", "Shutting down headless node (signal)")
        return 0
    log.info(
        "parallel_state.py:1210",
        f"Node rank {args.node_rank} joined the group of {args.nnodes} at {host}:{port}",
    )
    how = follow(sock, stop.is_set)
    sock.close()
    if how == "shutdown":
        log.info("multiproc_executor.py:540", "Master shut down; headless node exiting")
        return 0
    if how == "stopped":
        log.info("launcher.py:88", "Shutting down headless node (signal)")
        return 0
    log.error(
        "multiproc_executor.py:552",
        f"RuntimeError: lost the connection to master {host}:{port}; exiting",
    )
    return 1


def _head(
    args: serve_args.ServeArgs,
    tenv: TwinEnv,
    state: node.NodeState,
    stop: _Stop,
    log: EngineLog,
    started_at: float,
) -> int:
    landscape = tenv.landscape
    try:
        config = serve_args.config_of(args, landscape.engine_defaults.model_dump())
        settings = landscape.settings(config, max_model_len=args.max_model_len)
    except KnobError as e:
        log.error("arg_utils.py:1412", f"ValueError: {e}")
        return 1
    max_model_len = settings.max_model_len
    server_state = ServerState(
        served_model_name=args.served_model_name,
        model_path=args.model,
        max_model_len=max_model_len,
        k=settings.num_speculative_tokens,
        created=int(time.time()),
        requests_log=log if args.log_requests else None,
    )
    try:
        server, thread = start_server(args.host, args.port, server_state)
    except OSError as e:
        log.error(
            "api_server.py:1930",
            f"OSError: [Errno {e.errno}] could not bind {args.host}:{args.port}: {e.strerror}",
        )
        return 1
    log.info(
        "api_server.py:1922",
        f"Started server process [{os.getpid()}] on http://{args.host}:{args.port} (loading)",
    )
    head: Head | None = None
    try:
        rates = [state.matmul_rate]
        if args.nnodes > 1:
            head = _listen(args, log, started_at, tenv.token)
            if head is None:
                return 1
            code = _gather(head, args, landscape, stop, log, rates)
            if code is not None:
                return code
        speed = min(rates)
        if speed < 1.0:
            log.warning(
                "gpu_worker.py:245",
                f"Slowest node runs at matmul_rate={speed:.3f}; the TP group runs at its pace",
            )
        return _boot_and_serve(
            args, tenv, state.boots, settings, server_state, speed, stop, log, head
        )
    finally:
        if head is not None:
            head.shutdown(notify=stop.fatal is None and stop.event.is_set())
        server.shutdown()
        server.server_close()
        thread.join(timeout=1.0)


def _listen(
    args: serve_args.ServeArgs, log: EngineLog, started_at: float, token: str
) -> Head | None:
    """Rank 0's rendezvous listener on the master address; ``None`` (logged) if it cannot bind.
    A worker of another cluster (another token) is refused with a warning line."""
    try:
        head = Head(
            args.master_addr,
            args.master_port,
            args.nnodes,
            _fingerprint(args),
            started_at,
            token=token,
        )
    except OSError as e:
        log.error(
            "parallel_state.py:1120",
            f"OSError: [Errno {e.errno}] cannot listen on master "
            f"{args.master_addr}:{args.master_port}: {e.strerror}",
        )
        return None

    def foreign(peer: str, rank: object) -> None:
        log.warning(
            "multiproc_executor.py:109",
            f"Refused node rank {rank!r} from {peer}: its rendezvous token is another "
            "cluster's; still waiting for this cluster's own",
        )

    head.on_foreign = foreign
    return head


def _gather(
    head: Head,
    args: serve_args.ServeArgs,
    landscape: Landscape,
    stop: _Stop,
    log: EngineLog,
    rates: list[float],
) -> int | None:
    """Wait for every headless rank to join ``head`` and watch them from then on.

    Each member's matmul rate is appended to ``rates``; a lost member sets ``stop.fatal``.
    Returns an exit status when the head ends here (the rendezvous failed, or a signal), else
    ``None``.
    """
    timeout = rendezvous_window(landscape)
    log.info(
        "multiproc_executor.py:97",
        f"Waiting up to {timeout:.2f}s for {args.nnodes - 1} headless node(s) "
        f"to join at {head.address}",
    )
    try:
        members = head.wait(timeout, stop.is_set)
    except RendezvousError as e:
        hint = "; start every headless rank before rank 0" if e.missing else ""
        log.error("multiproc_executor.py:104", f"RuntimeError: {e}{hint}")
        return 1
    if stop.is_set():
        return _shutdown(log, head)
    for m in members:
        log.info(
            "multiproc_executor.py:112",
            f"Node rank {m.rank} joined from {m.peer} (matmul_rate={m.matmul_rate:.3f})",
        )
        rates.append(m.matmul_rate)

    def lost(rank: int) -> None:
        stop.fatal = f"lost node rank {rank}"

    head.on_lost = lost

    def silent(rank: int) -> None:
        # vLLM's line when a rank of the group stops answering its broadcasts
        log.warning(
            "shm_broadcast.py:466",
            f"No available shared memory broadcast block found in {SILENT_S:g} seconds. This "
            "typically happens when some processes are hanging or doing some time-consuming "
            f"work (node rank {rank} has not answered).",
        )

    head.on_silent = silent
    if head.lost is not None:
        lost(head.lost)
    return None


def _boot_and_serve(
    args: serve_args.ServeArgs,
    tenv: TwinEnv,
    boots: int,
    settings: Settings,
    server_state: ServerState,
    speed: float,
    stop: _Stop,
    log: EngineLog,
    head: Head | None,
) -> int:
    """Boot (after the rendezvous), then serve at ``speed`` until a signal or a lost rank."""
    landscape = tenv.landscape
    boot_factor = noise.boot_factor(tenv.seed, boots, landscape.noise.boot_to_boot)
    code = _boot(args, landscape, settings, stop, log)
    if stop.fatal is not None:
        return _engine_dead(log, stop.fatal)
    if code is not None:
        return code
    engine = Engine(
        landscape.engine_model(settings),
        speed=speed * boot_factor,
        seed=tenv.seed,
        boot=boots,
        # a worker stopped holds the group's steps, as a collective waits on its slowest rank
        held=head.silent if head is not None else None,
    )
    engine.start()
    server_state.engine = engine
    log.info("api_server.py:1971", f"Starting vLLM API server 0 on http://{args.host}:{args.port}")
    log.raw("INFO:     Application startup complete.")
    while not stop.is_set():
        stop.event.wait(0.05)
    engine.stop()
    if stop.fatal is not None:
        return _engine_dead(log, stop.fatal)
    return _shutdown(log, head)


def _engine_dead(log: EngineLog, why: str) -> int:
    """Exit status 1 after vLLM's error for a rank lost from the tensor-parallel group."""
    log.error(
        "multiproc_executor.py:233",
        f"RuntimeError: NCCL error: remote process exited or there was a network "
        f"error ({why}); engine core dead",
    )
    return 1


def _shutdown(log: EngineLog, head: Head | None) -> int:
    log.info("launcher.py:80", "Shutting down FastAPI HTTP server.")
    if head is not None:
        head.shutdown()
    log.raw("INFO:     Shutting down")
    return 0


def _boot(
    args: serve_args.ServeArgs,
    landscape: Landscape,
    settings: Settings,
    stop: _Stop,
    log: EngineLog,
) -> int | None:
    """The boot phases after rendezvous; an exit status when the boot ends early, else None."""
    b = landscape.boot
    sleep = stop.sleep
    if not sleep(landscape.scaled(b.load_s)):
        return _stopped(log)
    log.info(
        "gpu_model_runner.py:2653",
        f"Model loading took {b.weights_gib:.2f} GiB and {landscape.scaled(b.load_s):.2f} seconds",
    )
    if not _load_drafter(args, settings, b.mask_token_id, log):
        return 1
    if not sleep(landscape.scaled(b.compile_s)):
        return _stopped(log)
    log.info(
        "backends.py:215",
        f"Compiling a graph for dynamic shape takes {landscape.scaled(b.compile_s):.2f} s",
    )
    if not sleep(landscape.scaled(b.kv_profile_s)):
        return _stopped(log)
    status, reason = landscape.boot_status(settings)
    if not _profile_memory(landscape, settings, status, reason, log):
        return 1
    if settings.cuda_graphs:
        log.info(
            "gpu_model_runner.py:3480", "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
        )
    else:
        log.info("core.py:94", "Cudagraph is disabled under eager mode")
    if status == "wedge":
        # a wedge announces nothing: the boot just never finishes
        while not stop.is_set():
            stop.event.wait(0.05)
        return _stopped(log)
    if settings.cuda_graphs:
        if not sleep(landscape.scaled(b.graph_capture_s)):
            return _stopped(log)
        log.info(
            "gpu_model_runner.py:3562",
            f"Graph capturing finished in {landscape.scaled(b.graph_capture_s):.2f} secs",
        )
    return None


def _load_drafter(
    args: serve_args.ServeArgs, settings: Settings, mask_token_id: int, log: EngineLog
) -> bool:
    """Log the drafter's loading (and its DFlash mask embedding); ``False`` (logged) when the
    speculative config names a drafter directory that does not exist."""
    drafter = args.drafter_dir
    if args.speculative is None or (drafter is None and args.speculative.get("method") == "ngram"):
        return True  # no drafter to load: no speculation, or n-gram lookup
    method = args.speculative.get("method", "draft_model")
    if drafter is None or not drafter.is_dir():
        log.error(
            "speculative.py:412",
            f"ValueError: speculative model {str(drafter)!r} is not a directory",
        )
        return False
    log.info(
        "speculative.py:398",
        f"Loading drafter ({method}) from {drafter} "
        f"with num_speculative_tokens={settings.num_speculative_tokens}",
    )
    if (drafter / "mask_embedding.pt").is_file():
        token = _mask_token(drafter, mask_token_id)
        log.info(
            "dflash.py:231",
            f"Loaded DFlash mask embedding for mask_token_id {token} from mask_embedding.pt",
        )
    return True


def _profile_memory(
    landscape: Landscape, settings: Settings, status: BootStatus, reason: str, log: EngineLog
) -> bool:
    """The memory profile's outcome in vLLM's words; ``False`` (logged) when the boot dies of
    it (out of memory, or too little KV cache for ``max_model_len``)."""
    b = landscape.boot
    free = b.device_gib * settings.gpu_memory_utilization - b.weights_gib
    if status == "oom":
        log.error(
            "core.py:708",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
            "GPU 0 has a total "
            f"capacity of {b.device_gib:.2f} GiB of which 1.21 GiB is free. ({reason})",
        )
        log.error("core.py:712", "EngineCore failed to start.")
        return False
    if status == "kv_capacity":
        log.error(
            "kv_cache_utils.py:716",
            "ValueError: To serve at least one request with the models's max seq len "
            f"({settings.max_model_len}), more KV cache memory is needed than the available "
            f"{max(free, 0.0):.2f} GiB. Try increasing `gpu_memory_utilization` or decreasing "
            f"`max_model_len` when initializing the engine. ({reason})",
        )
        return False
    log.info("gpu_worker.py:298", f"Available KV cache memory: {free:.2f} GiB")
    return True


def _mask_token(drafter: Path, default: int) -> int:
    try:
        data = json.loads((drafter / "config.json").read_text())
    except (OSError, ValueError):
        return default
    token = data.get("mask_token_id") if isinstance(data, dict) else None
    return token if isinstance(token, int) and not isinstance(token, bool) else default


def _stopped(log: EngineLog) -> int:
    log.info("launcher.py:80", "Shutting down (signal during boot).")
    return 0


def main_serve(argv: list[str]) -> int:
    """``serve`` with the process environment; malformed twin settings exit 2 or 3. An engine
    that shut down cleanly on a signal then dies of it (``_Stop.die_of_signal``)."""
    stop = _Stop()
    try:
        code = serve(argv, os.environ, stop)
    except OrchestrateError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    if code == 0:
        stop.die_of_signal()
    return code
