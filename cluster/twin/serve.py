"""``serve``: one node of the twin, booting and failing the way a vLLM rank does.

Rank 0 serves HTTP from the start (``/health`` 503 while booting), waits for every headless
rank to join, then loads, compiles, profiles memory (an OOM or a too-small KV cache ends the
boot), captures graphs (or wedges, on stacks that declare it) and becomes healthy. Headless
ranks initialise, print ``WORKER_READY_LINE``, join the head and stay until it goes away.
Durations come from the landscape's boot section divided by its boot time scale.

It owns a node's part in the group: the topology a rank may take, what every rank must agree
on, the rendezvous and its wall-clock floors, serving until a signal or a lost rank, and the
exit status each ending leaves. The boot phases after the rendezvous are
``cluster.twin.phases``'s; the ``TWIN_*`` settings ``cluster.twin.environment``'s; the signals
``cluster.twin.stop``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping

from cluster.twin import args as serve_args
from cluster.twin import node, noise
from cluster.twin.engine import Engine
from cluster.twin.environment import TwinEnv, twin_env
from cluster.twin.landscape import Landscape
from cluster.twin.log import EngineLog
from cluster.twin.phases import boot
from cluster.twin.physics import Settings
from cluster.twin.rendezvous import SILENT_S, Head, RendezvousError, follow, join
from cluster.twin.server import VLLM_VERSION, ServerState, start_server
from cluster.twin.stop import Stop
from knobs.errors import KnobError
from orchestrator.errors import OrchestrateError

#: Wall-clock floors of the rendezvous waits, whatever the boot time scale: a host under load
#: must not turn a good start order into a failed one.
MIN_RENDEZVOUS_S = 1.0
MIN_WORKER_WAIT_S = 10.0


def rendezvous_window(landscape: Landscape) -> float:
    """Seconds rank 0 waits for its headless ranks (the scaled timeout, at least 1 s)."""
    return max(landscape.scaled(landscape.boot.rendezvous_timeout_s), MIN_RENDEZVOUS_S)


def serve(argv: list[str], env: Mapping[str, str], stop: Stop | None = None) -> int:
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
    stop = stop or Stop()
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
    stop: Stop,
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
    stop: Stop,
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
    stop: Stop,
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

    def starved(rank: int, late_s: float, heard: bool) -> None:
        # the twin's own line (vLLM has none): a hold, or the lack of one, the log says
        log.warning(
            "rendezvous.py:248",
            f"The watch of node rank {rank} was kept off the CPU for {late_s:.1f}s (this host "
            "busy, or this process stopped): "
            + (
                "its beats were waiting, read late; the rank was not silent, and the engine "
                "was not held for it."
                if heard
                else "no beat of it was waiting; the engine is held if it stays silent."
            ),
        )

    head.on_starved = starved
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
    stop: Stop,
    log: EngineLog,
    head: Head | None,
) -> int:
    """Boot (after the rendezvous), then serve at ``speed`` until a signal or a lost rank."""
    landscape = tenv.landscape
    boot_factor = noise.boot_factor(tenv.seed, boots, landscape.noise.boot_to_boot)
    code = boot(args, landscape, settings, stop, log)
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


def main_serve(argv: list[str]) -> int:
    """``serve`` with the process environment; malformed twin settings exit 2 or 3. An engine
    that shut down cleanly on a signal then dies of it (``Stop.die_of_signal``)."""
    stop = Stop()
    try:
        code = serve(argv, os.environ, stop)
    except OrchestrateError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    if code == 0:
        stop.die_of_signal()
    return code
