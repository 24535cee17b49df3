"""The words a round is recorded in: statuses, states, kinds, roles and failure classes.

Each but the failure class is a ``StrEnum``, in the spirit of Optuna's ``TrialState``: a
member *is* its string, so the ledger stores exactly the values it always stored (``"keep"``,
``"deploying"``, ``"remeasure"`` …), results.tsv and MLflow show them unchanged, and older
ledgers read back as members. Code names the member (``Status.KEEP``), never the bare string,
and mypy holds the fields of the ledger's records to these types. The failure class is a
``Literal`` (mypy checks it just the same): a raise site names it as the word it stores.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Status(StrEnum):
    """How an experiment was decided (``ExperimentRecord.status``, results.tsv's ``status``)."""

    KEEP = "keep"
    DISCARD = "discard"
    CRASH = "crash"
    INCONCLUSIVE = "inconclusive"
    INVALID = "invalid"
    VETOED = "vetoed"


class Undecided(StrEnum):
    """A verdict that is not final yet: another boot is wanted."""

    MORE = "more"  # undecided: another boot (of the candidate, or of the champion)
    CONFIRM = "confirm"  # promising: confirmation boots before a keep


class State(StrEnum):
    """Where an experiment is on its way (``ExperimentRecord.state``); each is committed
    before the next step starts."""

    APPROVED = "approved"
    DEPLOYING = "deploying"
    BENCHING = "benching"
    MEASURED = "measured"
    DECIDED = "decided"


class Kind(StrEnum):
    """What an experiment is: the first measurement of the configured champion, or a change."""

    BASELINE = "baseline"
    CANDIDATE = "candidate"


class BootRole(StrEnum):
    """Why a config was booted (``BootRecord.role``)."""

    MEASURE = "measure"  # an experiment's first measurement
    REPEAT = "repeat"  # another boot while the verdict is undecided
    CONFIRM = "confirm"  # a confirmation boot of a promising candidate
    REMEASURE = "remeasure"  # the champion measured again (its evidence, the drift sentinel)


class BootStatus(StrEnum):
    """Where a boot is (``BootRecord.status``)."""

    BOOTING = "booting"
    UP = "up"
    DOWN = "down"  # measured and torn down
    FAILED = "failed"


class ProposalStatus(StrEnum):
    """A proposal's decision (``ProposalRecord.status``)."""

    PENDING = "pending"
    APPROVED = "approved"
    VETOED = "vetoed"


class RoundStatus(StrEnum):
    """A round's state (``RoundRecord.status``)."""

    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


class EventKind(StrEnum):
    """What an event of the ledger records (``EventRecord.kind``)."""

    #: a person cleared a known-bad region (subject: the experiment that barred it)
    KNOWN_BAD_CLEARED = "known-bad-cleared"
    #: a stale claim on a node was broken with ``--force`` (subject: the node)
    CLAIM_BROKEN = "claim-broken"
    #: the profile gained a knob; the champion takes its default (subject: the knob)
    KNOB_ADDED = "knob-added"
    #: the profile lost a knob; it is dropped from the champion (subject: the knob)
    KNOB_REMOVED = "knob-removed"
    #: the ledger's schema was upgraded (subject: the new revision)
    LEDGER_UPGRADED = "ledger-upgraded"
    #: a kept change's boots left its level as champion: its first boot of its own read too far
    #: below them (subject: the champion's experiment id; detail: from which measurement)
    KEEP_BOOTS_SET_ASIDE = "keep-boots-set-aside"
    #: a round stopped short of its end, open for the same command to resume (subject: the
    #: round's id; reason: the line the command ended with; detail: the error and exit code)
    ROUND_STOPPED = "round-stopped"
    #: an unfinished round was taken up again by a later command (subject: the round's id;
    #: detail: the boots the run before it had left open, which the resume closes)
    ROUND_RESUMED = "round-resumed"
    #: a round or ``cluster up`` ran under a profile other than the last one recorded for the
    #: cluster (subject: its digest; detail: its name, knob space, cells, objective, and a
    #: digest of each of its sections: ``orchestrator.revision``)
    PROFILE_REVISED = "profile-revised"
    #: a round's close in MLflow (its parent run's numbers, report, results.tsv) is owed,
    #: recorded before the ledger closes the round (subject: the round's id;
    #: ``orchestrator.round_close``)
    ROUND_CLOSE_OWED = "round-close-owed"
    #: … and written: MLflow has it (subject: the round's id)
    ROUND_CLOSE_WRITTEN = "round-close-written"


#: How a boot or a bench failed (``NodeError.failure_class``, the ledger's ``failure_class``).
#: A ``Literal``, checked by mypy, so that a raise site names its class as the word it stores.
FailureClass = Literal[
    "unreachable",
    "auth",
    "host_key",
    "upload",
    "start",
    "port_in_use",
    "disk_full",
    "gpu_fault",
    "network",
    "worker_missing",
    "boot_timeout",
    "boot_wedge",
    "oom",
    "kv_capacity",
    "gate_failed",
    "preflight_failed",
    "smoke_failed",
    "clocks_stuck",
    "bench_failed",
    "remote_failed",
    "engine_stopped",
    "engine_killed",
]
FAILURE_CLASSES: tuple[FailureClass, ...] = get_args(FailureClass)


#: Failure classes that mean "we could not reach or trust the node" (CLI exit 5).
NODE_ACCESS: frozenset[FailureClass] = frozenset({"unreachable", "auth", "host_key"})

#: Failure classes that are the infrastructure's, never the config's: a boot that failed so is
#: taken again, then stops the round (exit 5) with its experiment undecided; it bars no value.
#: Stuck clocks are the node's too: a boot measured with them is set aside and taken again; a
#: port another process holds (``port_in_use``) is the host's, where ``start`` is a bad flag;
#: a node that fails a preflight gate (``preflight_failed``: its interface, its memory not
#: settled or not free, a clocks query that printed nonsense) failed before the config ran; a
#: full disk (``disk_full``: an engine that could not write its cache or its files) is the
#: node's, however the config got there; so is a GPU or driver that failed (``gpu_fault``:
#: an ECC error, a GPU off the bus, a driver upgraded under the running system), and a node
#: that could not reach the network its engine downloads from (``network``). An engine found
#: stopped (``engine_stopped``: SIGSTOP, a suspended host, a debugger: no config stops its own
#: engine) is its node's, and so is one that died of a SIGTERM, SIGINT, SIGHUP or SIGQUIT that
#: orchestrate did not send (``engine_killed``: a person's kill, a service manager, a host
#: shutting down).
INFRASTRUCTURE: frozenset[FailureClass] = frozenset(
    {
        *NODE_ACCESS,
        "upload",
        "worker_missing",
        "remote_failed",
        "clocks_stuck",
        "port_in_use",
        "preflight_failed",
        "disk_full",
        "gpu_fault",
        "network",
        "engine_stopped",
        "engine_killed",
    }
)

#: A preflight gate's failure before it had a class of its own (``gate_failed``, a configuration
#: class, until the thirty-seventh session) is told by its message's words, which no boot-log
#: gate's message ("boot log has a forbidden line", "… lacks a required line") has.
_PREFLIGHT_WORDS = (
    "is not on ",
    ": interface ",
    "free memory still changing",
    "MiB free after settling",
    "the clocks query printed",
)


def read_failure_class(stored: str | None, detail: str | None) -> str | None:
    """A stored failure class as this release names it: a ledger written before
    ``preflight_failed`` holds a preflight gate's failure as ``gate_failed``, which is read as
    the infrastructure's class it was (so it bars nothing now); every other class as stored."""
    old_preflight = (
        stored == "gate_failed"
        and detail is not None
        and "boot log" not in detail
        and any(words in detail for words in _PREFLIGHT_WORDS)
    )
    return "preflight_failed" if old_preflight else stored


#: The verdict rules that discard a change for what it broke (failed requests, time to first
#: token), whatever its objective. A knob may declare one monotone in its values
#: (``KnobSpec.monotone_guardrails``).
GuardrailRule = Literal["errors", "ttft-guardrail"]
GUARDRAIL_RULES: frozenset[GuardrailRule] = frozenset(get_args(GuardrailRule))

#: Statuses whose experiment has no objective of its own: it never booted, or was never run.
UNMEASURED = frozenset({Status.CRASH, Status.VETOED})

#: Statuses whose objective is a trustworthy measurement of the config that ran. An ``invalid``
#: config may carry a (fast, wrong) objective: it must never count as a measurement.
MEASURED = frozenset({Status.KEEP, Status.DISCARD, Status.INCONCLUSIVE})

#: A boot's ``failure_detail`` where no failure ended it but a run that stopped: an interrupt
#: (Ctrl-C, SIGTERM, SIGHUP) whose teardown ran and closed it (``interrupted; torn down``), a
#: resume's cleanup of a boot a killed run left open (``interrupted``; a ledger from before
#: the first holds it for both), or ``orchestrate cluster down`` closing one
#: (``cluster down``); and what a person reads of each.
BOOT_TORN_DOWN = "interrupted; torn down"
BOOT_INTERRUPTED = "interrupted"
BOOT_CLOSED_BY_DOWN = "cluster down"
CUT_SHORT = {
    BOOT_TORN_DOWN: "cut short: the run was interrupted (Ctrl-C, SIGTERM or SIGHUP); its "
    "teardown ran and stopped its engines",
    BOOT_INTERRUPTED: "cut short: the run was interrupted or killed before its teardown",
    BOOT_CLOSED_BY_DOWN: "cut short: a killed run left it up; `orchestrate cluster down` closed it",
}
#: The start of a boot's ``failure_detail`` where an error of orchestrate's (not the boot's,
#: not an interrupt) stopped the round mid-boot, its engines torn down: ``error: `` and the
#: error's first line, which the command printed too.
BOOT_ERRORED = "error: "
#: The start of a boot's ``failure_detail`` where its round lost the nodes mid-boot (a node's
#: claim broken, by ``orchestrate cluster down|up --force`` or another orchestrator): ``claim
#: lost: `` and who broke it and stopped its engines, as far as known. Ended by whichever
#: learns it first: the command that broke the claim, or the round at its next safe point.
BOOT_CLAIM_LOST = "claim lost: "


def cut_short(detail: str | None) -> str | None:
    """What a person reads of a boot no failure of its own ended (``detail`` its
    ``failure_detail``), if a run's stop ended it; else None."""
    if detail is None:
        return None
    if detail.startswith(BOOT_CLAIM_LOST):
        return f"cut short: its round lost the nodes: {detail[len(BOOT_CLAIM_LOST) :]}"
    if detail.startswith(BOOT_ERRORED):
        return (
            f"cut short: an error of orchestrate's stopped the run: {detail[len(BOOT_ERRORED) :]}"
        )
    return CUT_SHORT.get(detail)
