"""A head's boot phases after its rendezvous, in vLLM's words: the weights loaded, the drafter
(and its DFlash mask embedding), the graphs compiled, the memory profiled (an OOM or too small
a KV cache ends the boot), CUDA graphs captured, or a wedge that never finishes.

It owns what each phase logs and when a phase ends the boot; how long each takes is the
landscape's boot section, divided by its boot time scale.
"""

from __future__ import annotations

import json
from pathlib import Path

from cluster.twin import args as serve_args
from cluster.twin.landscape import Landscape
from cluster.twin.log import EngineLog
from cluster.twin.physics import BootStatus, Settings
from cluster.twin.stop import Stop


def boot(
    args: serve_args.ServeArgs,
    landscape: Landscape,
    settings: Settings,
    stop: Stop,
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
