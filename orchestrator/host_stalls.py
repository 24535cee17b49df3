"""What a busy host may have cost a boot's objective: the error its stalls add to a verdict.

A cell whose window its hosts stalled (``cluster.stall``) is measured again, up to three times,
and the least stalled measurement is kept for the objective: setting such cells aside would
reboot most configs on a busy host, and a boot costs minutes. What the kept window read is
then not the config's alone. A stall of ``s`` seconds around a window of ``w`` seconds can move
at most ``min(1, s / w)`` of the window's tokens across its edges, so a cell that makes a share
``c`` of the boot's objective can be off by up to ``c · min(1, s / w)`` of it. Summed over the
boot's cells, that is the boot's stall error (``boot_error``, relative, as the log objective's).

The verdict adds it to its standard error (``side_error``: averaged over a side's boots as
errors average, then in quadrature with the noise model's error: ``HostError``). An error so
wide leaves the posterior at the prior, which alone may put less than the futility above the
equivalence; so a keep must also hold at the least favourable reading the stalls allow and a
discard, by either futility rule, at the most favourable (``side_bound``: ``HostError.judged``,
and the predictive futility reads ``g + bound``): a stall can neither keep a change nor put a
keep out of reach. The verdict's ``se`` is the widened one, so the knob's learned prior
(``priors``) weighs such a change as little as it told. A boot whose error
is more than ``stall.DISTURBED_FRACTION`` of its objective (``disturbed``) teaches the noise
model nothing and is counted, once, by ``round_boots`` (the report's infrastructure share, its
MLflow summary, ``status``). A boot reused in a later verdict (``pooling``: an earlier look at
the value, another value of the knob) carries its error there, or, disturbed, is left out
(``reusable``). Where no cell stalled every error is 0 and nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from cluster import stall
from knobs.records import CellResultRecord
from knobs.vocabulary import GUARDRAIL_RULES
from orchestrator.posterior import Prior, posterior

#: a stall error the verdict's words name (relative: a tenth of a percent)
SAID = 0.001


def boot_error(cells: Sequence[CellResultRecord]) -> float:
    """The relative error a boot's hosts' stalls may have put into its objective: each cell's
    share of the objective (repeats of a cell count as their mean, as ``verdict.objective``)
    times ``min(1, stalled seconds / window seconds)``, summed over the cells."""
    by_cell: dict[str, list[CellResultRecord]] = {}
    for cell in cells:
        by_cell.setdefault(cell.cell, []).append(cell)
    total = 0.0
    moved = 0.0
    for runs in by_cell.values():
        throughput = sum(r.output_throughput for r in runs) / len(runs)
        fraction = sum(
            min(1.0, stall.stalled(r) / r.duration) if r.duration > 0 else 0.0 for r in runs
        ) / len(runs)
        total += throughput
        moved += throughput * fraction
    return moved / total if total > 0 else 0.0


def reusable(cells: Sequence[CellResultRecord]) -> float | None:
    """The stall error a boot carries where its objective is reused beyond the verdict that
    booted it (``pooling``: its value's earlier look pooled into a later one, or another value
    of its knob): its ``boot_error``; ``None`` where it is ``disturbed``, which leaves it out
    (it measured the host: as the noise model, a pooled prior has no bound to read it at). The
    one rule every reuse of a boot's objective follows; a verdict's own boots and the
    champion's are weighed with their errors and bounds (``HostError``) instead."""
    error = boot_error(cells)
    return None if disturbed_any([error]) else error


def side_error(errors: Sequence[float]) -> float:
    """A side's stall error in the mean of its boots' log objectives: ``√Σ e²`` over its ``n``
    boots, over ``n`` (independent errors average so)."""
    if not errors:
        return 0.0
    return math.sqrt(sum(e * e for e in errors)) / len(errors)


def side_bound(errors: Sequence[float]) -> float:
    """The most the stalls may have moved a side's mean log objective: the mean of its boots'
    errors (a bound, not an error: it does not average away)."""
    return sum(errors) / len(errors) if errors else 0.0


def disturbed_any(*sides: Sequence[float]) -> bool:
    """Whether any boot of the sides' (their ``boot_error``) is ``disturbed``."""
    return any(e > stall.DISTURBED_FRACTION for side in sides for e in side)


def disturbed(cells: Sequence[CellResultRecord]) -> bool:
    """Whether a boot's hosts may have moved its objective by more than
    ``stall.DISTURBED_FRACTION`` of it: a boot that measured the host, not only the config."""
    return disturbed_any([boot_error(cells)])


def every_disturbed(errors: Sequence[float]) -> bool:
    """Whether a busy host disturbed every one of a change's boots (``errors``: each boot's
    ``boot_error``), and there was one: it measured the host as much as the config. What a
    record says of it (``busy_words``) and what the round does after several in a row
    (``busy_host``)."""
    return bool(errors) and all(e > stall.DISTURBED_FRACTION for e in errors)


#: the discard rules that read the objective at the most favourable reading a side's stalls
#: allow (``HostError.judged``; the predictive futility reads ``g + bound``)
_BOUNDED_DISCARDS = frozenset({"posterior", "futility"})


def busy_words(
    boots: Sequence[Sequence[CellResultRecord]], discarded_by: str | None = None
) -> str | None:
    """What a record says of a change none of whose boots (``boots``: each boot's cells) a
    busy host left undisturbed (``every_disturbed``): its objective is the host's as much as
    the config's. A discard (``discarded_by``, its rule) says what it rests on all the same:
    a guardrail (judged on windows no host stalled), or the objective at the most favourable
    reading the stalls allow; a record that said "the host's reading" beside a discard that
    barred a region said the opposite of its status. ``None`` where a boot was undisturbed,
    or there was none."""
    errors = [boot_error(cells) for cells in boots]
    if not every_disturbed(errors):
        return None
    said = (
        "every boot measured on a busy host (its stalls may have moved the objective up to "
        f"±{100 * max(errors):.0f}%)"
    )
    if discarded_by in GUARDRAIL_RULES:
        return f"{said}; the discard rests on its guardrail ({discarded_by}), not on the objective"
    if discarded_by in _BOUNDED_DISCARDS:
        return f"{said}; the discard holds at the most favourable reading they allow"
    return f"{said}: the host's reading, not the change's"


@dataclass(frozen=True)
class HostError:
    """What the hosts' stalls may have done to a verdict's log ratio: ``se``, the error they
    add (both sides', in quadrature), and ``bound``, the most they may have moved it (both
    sides' bounds added: a stall may move tokens into a window or out of it)."""

    se: float = 0.0
    bound: float = 0.0
    #: a boot of either side is ``disturbed``
    disturbed: bool = False

    @classmethod
    def of(cls, candidate: Sequence[float], champion: Sequence[float]) -> HostError:
        """From each side's per-boot ``boot_error``."""
        return cls(
            se=math.hypot(side_error(candidate), side_error(champion)),
            bound=side_bound(candidate) + side_bound(champion),
            disturbed=disturbed_any(candidate, champion),
        )

    @property
    def said(self) -> bool:
        """Whether the verdict's words name it (a tenth of a percent or more)."""
        return self.se >= SAID

    def stats(self, noise_se: float, keep_p: float, discard_p: float) -> dict[str, float]:
        """What the verdict records of it: ``stall_se`` and ``stall_bound``, the noise
        model's error alone, and the chances the verdict acted on (``judged``)."""
        return {
            "stall_se": self.se,
            "stall_bound": self.bound,
            "noise_se": noise_se,
            "stall_p_gain": keep_p,
            "stall_p_worth": discard_p,
        }

    def words(self, keep_p: float, discard_p: float, equivalence_pct: float) -> str:
        """The verdict's words of it (after the posterior's). A bound of both sides' stalls
        may pass 100 % of the reading ("up to 152.3%" of a throughput is no number a person
        can use): said so instead."""
        moved = (
            "by more than the reading itself"
            if self.bound >= 1.0
            else f"up to {self.bound * 100:.1f}%"
        )
        return (
            f", a busy host widened the error ±{self.se * 100:.1f}% (its stalls may have moved "
            f"the reading {moved}: P(gain)={keep_p:.2f} at its least "
            f"favourable, P(gain>{equivalence_pct:g}%)={discard_p:.2f} at its most)"
        )

    def judged(
        self,
        g: float,
        noise_se: float,
        priors: tuple[Prior, Prior],
        equivalence: float,
        p_gain: float,
        p_worth: float,
    ) -> tuple[float, float]:
        """``P(gain)`` and ``P(gain > equivalence)`` of a reading ``g`` as the verdict may act
        on them: a keep only where the least favourable reading the stalls allow
        (``g - bound``, at the cluster's noise ``noise_se``) still reaches it, a discard only
        where the most favourable one (``g + bound``) is still futile. ``priors``: what the
        reading updates at the least and at the most favourable (the same prior twice, but
        where a pooled verdict's other values stalled too: ``pooling.Pooled.least``,
        ``most``). ``p_gain`` and ``p_worth``: the posterior's at the widened error. Without
        the second reading an error so wide that the posterior is the prior would discard as
        "not worth a change": the prior alone may put less than ``futility`` above the
        equivalence."""
        least, most = priors
        low = posterior(g - self.bound, noise_se, least).p_above(0.0)
        high = posterior(g + self.bound, noise_se, most).p_above(equivalence)
        return min(p_gain, low), max(p_worth, high)
