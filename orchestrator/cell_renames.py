"""A bench cell renamed under a ledger: its readings carry over, nothing is measured again.

Readings are matched to the profile's cells by name (``measurements.counts``), so a cell
renamed read as one removed and one added: the champion's level had no reading of the new
name, and the next round measured the champion again before judging a change. A cell now says
what it was called (``renamed_from: code-c1`` on the cell ``code-1``): its readings under the
old name count as its own where the definition they were measured under is its own (a cell
renamed and redefined is measured again, as a redefined one is). The ledger's readings keep
the name they were measured under; nothing is rewritten.

``renamed_from`` is checked as the profile loads (``profile_checks.check_renamed``: not a
name of the profile's cells, one cell each) and must name a cell the ledger has readings of
on the cluster (``check``: one line, exit 3, before the round writes anything). A cell of the
profile whose definition is in every measured field
that of a cell the profile no longer has (the latest reading of that one, recorded with its
definition) is read as that cell renamed (``resolved``), where exactly one such cell is
found: the readings of both measured the same thing. The round says so once, before the cell
is measured under its name now. The records of then keep their names (results.tsv, a
verdict's words).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from knobs.errors import ProfileError
from ledger import CellReading, Ledger
from orchestrator.profile import Profile


@dataclass
class _Cells:
    """The cells the ledger has readings of on a cluster, by name: the newest reading of each
    (by boot), and the boots that measured each."""

    latest: dict[str, CellReading] = field(default_factory=dict)
    boots: dict[str, set[int]] = field(default_factory=dict)

    @classmethod
    def read(cls, ledger: Ledger, cluster: str) -> _Cells:
        out = cls()
        for readings in ledger.cluster_cell_results(cluster).values():
            for r in readings:
                name = r.result.cell
                last = out.latest.get(name)
                if last is None or r.boot_id >= last.boot_id:
                    out.latest[name] = r
                out.boots.setdefault(name, set()).add(r.boot_id)
        return out

    def side_by_side(self, a: str, b: str) -> int | None:
        """A boot that measured both ``a`` and ``b`` (then neither is the other renamed)."""
        both = self.boots.get(a, set()) & self.boots.get(b, set())
        return min(both) if both else None


def check(profile: Profile, ledger: Ledger) -> None:
    """Each cell's ``renamed_from`` names a cell the ledger has readings of on the cluster.

    Raises:
        ProfileError: one that does not, in one line: what, where, what to do.
        LedgerError: the ledger failed.
    """
    declared = [c for c in profile.cells if c.renamed_from is not None]
    if not declared:
        return
    cluster = profile.cluster.name
    known = _Cells.read(ledger, cluster)
    for cell in declared:
        was = cell.renamed_from
        assert was is not None
        said = f"profile {profile.name}: cell {cell.name} says renamed_from: {was}"
        if was not in known.latest:
            names = ", ".join(sorted(known.latest)) or "none"
            raise ProfileError(
                f"{said}, a cell the ledger has no reading of on cluster {cluster} (its cells: "
                f"{names}): write the name its readings were measured under, or take "
                f"renamed_from out to measure {cell.name} as a new cell"
            )
        boot = known.side_by_side(was, cell.name)
        if boot is not None:
            raise ProfileError(
                f"{said}, but boot {boot} measured both, side by side: {cell.name} is not "
                f"{was} renamed; take renamed_from out"
            )


def resolved(profile: Profile, ledger: Ledger) -> tuple[Profile, list[str]]:
    """``profile`` with each cell renamed that the ledger shows renamed (see the module) saying
    so (``renamed_from``), and a line for each, in the round's words. The profile's digest is
    unchanged (``renamed_from`` is no part of it).

    Raises:
        LedgerError: the ledger failed.
    """
    known = _Cells.read(ledger, profile.cluster.name)
    latest = known.latest
    names = {c.name for c in profile.cells}
    taken = {c.renamed_from for c in profile.cells if c.renamed_from is not None}
    gone = {
        name: r.spec
        for name, r in latest.items()
        if name not in names and name not in taken and r.spec is not None
    }
    cells, lines = [], []
    for cell in profile.cells:
        if cell.renamed_from is not None:
            cells.append(cell)
            continue
        same = [
            name
            for name, spec in gone.items()
            if cell.same_definition(spec) and known.side_by_side(name, cell.name) is None
        ]
        if len(same) != 1:
            cells.append(cell)
            continue
        [was] = same
        del gone[was]
        cells.append(cell.model_copy(update={"renamed_from": was}))
        if cell.name in latest:  # said once: before it is measured under its name now
            continue
        lines.append(
            f"  cell {cell.name} is cell {was} renamed: the same definition in every measured "
            f"field, and {was} is no longer in the profile; its readings carry over, nothing "
            f"is measured again for it (to measure {cell.name} as a new cell, change one of "
            f"its fields; to say so, renamed_from: {was})"
        )
    if tuple(cells) == profile.cells:
        return profile, []
    return profile.model_copy(update={"cells": tuple(cells)}), lines
