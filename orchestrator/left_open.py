"""Stops for want of boots an earlier release recorded ``discard`` while it left them open for
another look: every reader shows them ``inconclusive``.

A change the verdict stops for want of boots while its posterior still promises a gain is
open for another look (``policy.open_for``): nothing was concluded of it, and the search
looks at it again. Since the forty-ninth session such a change is recorded ``inconclusive``.
Releases before recorded a futility stop ``discard``, and results.tsv, the report and
``experiments show`` gave it as written, beside "open for a second look" in its description:
a reader took the value for barred.

The record is not rewritten: the ledger keeps ``discard``, what that release wrote, and the
search reads the verdict's rule and posterior as it always has. The readers (``orchestrate
export`` and the round's results.tsv, the report, ``experiments show``) read such a row through
``read``: status ``inconclusive``, its description saying what was recorded (``WORDS``);
``experiments show --json`` keeps the ledger's word as ``recorded_status``.

Which rows (``left_open``): a ``discard`` whose verdict's rule stopped it for want of boots
(``policy.OUT_OF_BOOTS``), and either whose record says it was left open (``open for a second
look``, ``open for a further look``: the words releases wrote from 2026-12-07, 17204be, until
the forty-ninth session's) or, a record without those words, whose posterior still promises a
look by today's rule under the profile's verdict settings (``policy.look_promise``: what the
search reads of it, and why it looks at it again). One without a posterior (a release before
the posterior was recorded) or past its fair trial stays ``discard``.
"""

from __future__ import annotations

from collections.abc import Iterable

from knobs.vocabulary import Status
from ledger import ExperimentRecord, Ledger, VerdictRecord
from orchestrator import policy
from orchestrator.profile_sections import VerdictSpec

#: What a record left open for another look says (``policy.open_for``).
OPEN = ("open for a second look", "open for a further look")
#: What such a row's description adds wherever it is shown.
WORDS = (
    'recorded "discard" by an earlier release: stopped for want of boots and left open for '
    "another look, nothing concluded of it"
)


def left_open(spec: VerdictSpec, e: ExperimentRecord, verdict: VerdictRecord | None) -> bool:
    """Whether ``e``, recorded ``discard``, was stopped for want of boots and left open for
    another look (see the module); ``spec``: the profile's verdict settings."""
    if e.status != Status.DISCARD or verdict is None or verdict.rule not in policy.OUT_OF_BOOTS:
        return False
    if any(words in text for words in OPEN for text in (e.description, verdict.reason)):
        return True
    return policy.look_promise(spec, verdict.rule, verdict.stats) is not None


def read(
    spec: VerdictSpec, ledger: Ledger, experiments: Iterable[ExperimentRecord]
) -> list[ExperimentRecord]:
    """``experiments`` as every reader shows them: a row ``left_open`` reads ``inconclusive``,
    its description ending with ``WORDS``; the others as recorded."""
    out: list[ExperimentRecord] = []
    for e in experiments:
        if e.status == Status.DISCARD and left_open(spec, e, ledger.verdict(e.id)):
            shown = f"{e.description}; {WORDS}" if e.description else WORDS
            e = e.model_copy(update={"status": Status.INCONCLUSIVE, "description": shown})
        out.append(e)
    return out
