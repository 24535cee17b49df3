"""Reproducible noise draws of the twin: boot-to-boot, run-to-run, acceptance, stuck clocks.

Every draw is a pure function of ``(seed, keys…)``, so the engine, the tests and the
research-efficiency benchmark get the same numbers for the same seed, boot and run.
Factors are log-normal with median 1: ``exp(sd · z)``, ``z`` standard normal; for the small
``sd`` of a landscape (a few percent) the factor's standard deviation is ``sd`` within 1%.
"""

from __future__ import annotations

import hashlib
import math
import random


def rng(seed: int, *keys: object) -> random.Random:
    """A ``random.Random`` seeded from ``seed`` and ``keys`` (stable across processes)."""
    text = ":".join(str(k) for k in (seed, *keys))
    return random.Random(int.from_bytes(hashlib.sha256(text.encode()).digest()[:16], "big"))


def lognormal(generator: random.Random, sd: float) -> float:
    """A factor with median 1 and relative spread ``sd`` (``exp(sd · z)``); 1.0 when ``sd`` is 0."""
    if sd <= 0:
        return 1.0
    return math.exp(sd * generator.gauss(0.0, 1.0))


def boot_factor(seed: int, boot: int, sd: float) -> float:
    """The speed factor of boot number ``boot`` of an engine seeded ``seed``."""
    return lognormal(rng(seed, "boot", boot), sd)


def run_factors(
    seed: int, boot: int, run: int, speed_sd: float, acceptance_sd: float
) -> tuple[float, float]:
    """``(speed, acceptance)`` factors of run ``run`` (a burst of load on an idle engine)."""
    generator = rng(seed, "run", boot, run)
    return lognormal(generator, speed_sd), lognormal(generator, acceptance_sd)


def stuck_at_boot(seed: int, rank: int, boot: int, probability: float) -> bool:
    """Whether node ``rank`` comes up with stuck clocks at its boot number ``boot``."""
    if probability <= 0:
        return False
    return rng(seed, "stuck", rank, boot).random() < probability
