"""A round taken up again after it stopped: recorded as it resumes, read back for its report.

A round stopped short by a fault or an interrupt records its stop (``stops.record_stop``); a
round killed outright (kill -9, a crash, the host lost) records nothing as it dies. Either
way the same command resumes it, and each resume records a ``round-resumed`` event
(``record``) with the boots the run before it left open, which the resume then closes as
``interrupted`` (``boot.Booter.stop_stale``). So the report can say that the round was
interrupted, when it went on, and what each boot left open came to (``of_round``). A resume
killed before it closed them leaves them open for the next resume, which records them again:
each is said once, as left by the run that left it, and the next resume as the one that
closed it (``Resume.closed_for``). A round resumed by a release from before resumes were
recorded has only those closed boots to show for it: each batch of them is one resume, said
as inferred.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from knobs.vocabulary import BOOT_INTERRUPTED, BootStatus, EventKind
from ledger import BootRecord, EventRecord, Ledger, RoundRecord

#: Boots closed within this of each other were closed by one resume (an unrecorded one).
_ONE_RESUME = timedelta(seconds=60)


def record(
    ledger: Ledger, cluster: str, round_id: int, *, proposer: str, approve: str, seed: int
) -> None:
    """Round ``round_id`` is taken up again: recorded, with the boots the run before left open
    and the proposer, approval mode and seed the resume runs it with (its flags, else the
    round's as it started).

    Raises:
        LedgerError: the ledger failed.
    """
    left = ledger.open_boots(cluster)
    ledger.add_event(
        cluster,
        EventKind.ROUND_RESUMED,
        subject=str(round_id),
        detail={
            "left_open": [b.id for b in left],
            "proposer": proposer,
            "approve": approve,
            "seed": seed,
        },
        reason="resumed by the same command",
    )


@dataclass(frozen=True)
class LeftOpen:
    """A boot the run before a resume left open, and what came of it."""

    boot: BootRecord
    #: the cell readings it recorded before the run stopped
    cells: int
    #: the boot that went on with its measurement (the same experiment's and measurement's)
    continued_by: int | None

    def words(self) -> str:
        """What the boot came to, in words."""
        b = self.boot
        what = f"boot #{b.id} of experiment #{b.experiment_id}"
        if self.cells == 0:
            state = "coming up" if b.healthy_at is None else "up, no cell measured yet"
            return f"{what} was {state}: it measured nothing and counts for nothing"
        went_on = (
            f"; the measurement went on on boot #{self.continued_by}"
            if self.continued_by is not None
            else ""
        )
        return f"{what} had measured {self.cells} cell(s): those readings count{went_on}"


@dataclass(frozen=True)
class Resume:
    """The round taken up again."""

    at: datetime
    #: the stop recorded before it (``round-stopped``); ``None``: the run before it ended
    #: without a word (killed: kill -9, a crash, the host lost)
    stop: EventRecord | None
    left_open: list[LeftOpen] = field(default_factory=list)
    #: whether the ledger recorded the resume (``False``: inferred from the boots it closed)
    recorded: bool = True
    #: the proposer and the approval mode the resume ran the round with (``None``: not
    #: recorded, a resume of a release from before, or inferred)
    proposer: str | None = None
    approve: str | None = None
    #: boots an earlier resume found left open and was killed before it closed: this one
    #: closed them (boot id → when that earlier resume began). Each boot a run left open is
    #: listed once, in ``left_open`` of the first resume that found it.
    closed_for: dict[int, datetime] = field(default_factory=dict)


def of_round(ledger: Ledger, rnd: RoundRecord) -> list[Resume]:
    """The resumes of round ``rnd``, oldest first.

    Raises:
        LedgerError: the ledger failed.
    """
    mine = str(rnd.id)
    stops = [e for e in ledger.events(rnd.cluster, EventKind.ROUND_STOPPED) if e.subject == mine]
    events = [e for e in ledger.events(rnd.cluster, EventKind.ROUND_RESUMED) if e.subject == mine]
    boots = {b.id: b for b in ledger.boots_since(rnd.cluster, rnd.started_at)}
    cells: Counter[int] = Counter(
        r.boot_id for rs in ledger.cluster_cell_results(rnd.cluster).values() for r in rs
    )
    # each resume this release recorded, with the proposer and approval it ran with
    found = [
        (e.created_at, [boots[i] for i in _ids(e.detail.get("left_open")) if i in boots])
        for e in events
    ]
    ran = [(_text(e.detail.get("proposer")), _text(e.detail.get("approve"))) for e in events]
    recorded = [True] * len(found)
    # and, before this release first ran on the cluster (its first profile recorded), those an
    # older one made, found by the boots they closed: a boot this release closes as
    # interrupted is a resume's (recorded above); a Ctrl-C's reads torn down
    first = next(iter(ledger.events(rnd.cluster, EventKind.PROFILE_REVISED)), None)
    older = [b for b in boots.values() if first is None or _ended_before(b, first.created_at)]
    for at, left in _inferred(older):
        found.append((at, left))
        ran.append((None, None))
        recorded.append(False)
    order = sorted(range(len(found)), key=lambda i: found[i][0])
    out: list[Resume] = []
    since = rnd.started_at
    listed: dict[int, datetime] = {}  # each boot listed so far, by when its resume began
    for i in order:
        (at, left), (proposer, approve) = found[i], ran[i]
        before = [s for s in stops if since <= s.created_at <= at]
        out.append(
            Resume(
                at=at,
                stop=before[-1] if before else None,
                left_open=[
                    _came_to(b, cells[b.id], boots.values()) for b in left if b.id not in listed
                ],
                recorded=recorded[i],
                proposer=proposer,
                approve=approve,
                closed_for={b.id: listed[b.id] for b in left if b.id in listed},
            )
        )
        listed.update({b.id: at for b in left if b.id not in listed})
        since = at
    return out


def _ended_before(boot: BootRecord, at: datetime) -> bool:
    return boot.ended_at is not None and _aware(boot.ended_at) < _aware(at)


def _aware(at: datetime) -> datetime:
    """``at`` with its zone (SQLite's come back naive, written as UTC)."""
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)


def _text(raw: object) -> str | None:
    return raw if isinstance(raw, str) and raw else None


def _ids(raw: object) -> list[int]:
    return [i for i in raw if isinstance(i, int)] if isinstance(raw, list) else []


def _inferred(boots: Iterable[BootRecord]) -> list[tuple[datetime, list[BootRecord]]]:
    """Resumes a release from before they were recorded left: its boots closed as left open
    by an interrupted run, one resume for each batch closed together."""
    closed = sorted(
        (
            (b.ended_at, b)
            for b in boots
            if b.status == BootStatus.DOWN and b.failure_detail == BOOT_INTERRUPTED and b.ended_at
        ),
        key=lambda pair: pair[0],
    )
    out: list[tuple[datetime, list[BootRecord]]] = []
    for ended, b in closed:
        if out and ended - out[-1][0] <= _ONE_RESUME:
            out[-1][1].append(b)
        else:
            out.append((ended, [b]))
    return out


def _came_to(boot: BootRecord, cells: int, boots: Iterable[BootRecord]) -> LeftOpen:
    later = [
        b.id
        for b in boots
        if b.id > boot.id
        and b.experiment_id == boot.experiment_id
        and b.measurement == boot.measurement
    ]
    return LeftOpen(boot, cells, later[0] if later and cells else None)
