"""The twin-only settings a node reads from its environment (``TWIN_*``): the landscape and
its time-scale overrides, the node's state directory, the seed, the noise switch and the
cluster's rendezvous token. The command line stays a real ``vllm serve`` command line
(``cluster.twin.args``); what a real engine would not be told comes this way.

It owns how each variable is read and what a malformed one is refused with (one line naming
the variable and its value: exit 2 or 3, through ``cluster.twin.serve.main_serve``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cluster.twin import node
from cluster.twin.landscape import DEFAULT_LANDSCAPE, Landscape, load_landscape
from orchestrator.errors import UsageError

#: Environment of the twin (the command line stays a real ``vllm serve`` command line).
ENV_LANDSCAPE = "TWIN_LANDSCAPE"
ENV_SEED = "TWIN_SEED"
ENV_NOISE = "TWIN_NOISE"
ENV_BOOT_SCALE = "TWIN_BOOT_SCALE"
ENV_RUN_SCALE = "TWIN_RUN_SCALE"
#: the cluster's rendezvous token (issue #17): a head refuses a worker that brings another
ENV_TOKEN = "TWIN_RENDEZVOUS_TOKEN"  # noqa: S105 - the variable's name, not a secret


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
        node_dir=node.node_dir(env.get(node.ENV_NODE_DIR)),
        seed=seed,
        noise=not quiet,
        token=env.get(ENV_TOKEN, ""),
    )
