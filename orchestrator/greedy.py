"""The greedy check: speculative decoding is lossless, so a change whose greedy texts differ
from the champion's is a bug however fast it is (``verdict``'s rule ``greedy-mismatch``).

Each cell's requests carry a digest of each prompt's greedy text (``fingerprints``). Only the
texts the champion itself reproduced (the same digest in every request and every boot
weighed) say anything about a candidate; a cell where the champion reproduced none can check
no config, and a candidate cell sharing no checked prompt with the champion is unchecked
(``greedy-unchecked``), never passed.
"""

from __future__ import annotations

from collections.abc import Sequence

from knobs.records import NONDETERMINISTIC, CellResultRecord


def _reproduced(champion: Sequence[CellResultRecord]) -> dict[tuple[str, str], str]:
    """The champion's greedy text of each prompt, by cell, where the champion reproduced it:
    the same digest in every request and every boot given. A prompt the champion's own runs
    did not repeat (``NONDETERMINISTIC`` within a boot, or another text in another boot: batch
    neighbours, a kernel's autotuning) says nothing about a candidate and is left out."""
    seen: dict[tuple[str, str], set[str]] = {}
    for cell in champion:
        for key, digest in cell.fingerprints.items():
            prompt = key.removesuffix(NONDETERMINISTIC)
            seen.setdefault((cell.cell, prompt), set()).add(digest)
            if key != prompt:  # the champion's repeat differed from its first text
                seen[(cell.cell, prompt)].add(key)
    return {k: next(iter(v)) for k, v in seen.items() if len(v) == 1}


def irreproducible(champion: Sequence[CellResultRecord]) -> list[tuple[str, str]]:
    """The (cell, prompt) pairs of the champion's greedy texts, sorted, when it reproduced
    none of them in any cell (``_reproduced``): no change can be checked against such texts,
    and with ``check_greedy`` every verdict would be ``greedy-unchecked``. Empty while some
    text was reproduced, or none was recorded."""
    if _reproduced(champion):
        return []
    return sorted(
        {(c.cell, key.removesuffix(NONDETERMINISTIC)) for c in champion for key in c.fingerprints}
    )


def fingerprint_mismatch(
    candidate: Sequence[CellResultRecord], champion: Sequence[CellResultRecord]
) -> list[str]:
    """Prompt ids whose greedy text differs between candidate and champion in the same cell,
    among those the champion reproduced (``_reproduced``; ``champion``: the cells of its
    boots that the verdict weighs).

    Texts are compared cell by cell: the same prompt under another concurrency runs in
    other batch shapes, and on some engines (vLLM's CPU build in bf16, issue #7) that alone
    changes a greedy text, in every config alike.
    """
    theirs = _reproduced(champion)
    out = {
        prompt
        for cell in candidate
        for prompt, digest in cell.fingerprints.items()
        if theirs.get((cell.cell, prompt), digest) != digest
    }
    return sorted(out)


def unchecked_cells(
    candidate: Sequence[CellResultRecord], champion: Sequence[CellResultRecord]
) -> list[str]:
    """Cells of the candidate in which no prompt has a greedy fingerprint on both sides (on the
    champion's, one it reproduced): a greedy check there compares nothing, and finding no
    mismatch would prove nothing. A cell in which the champion reproduced none of its own
    texts is one no config can be checked in (the engine's texts there depend on more than
    the config: batch neighbours): it is left out while another cell is checked; with none
    checked, every cell is unchecked."""
    theirs: dict[str, set[str]] = {}
    for name, prompt in _reproduced(champion):
        theirs.setdefault(name, set()).add(prompt)
    texted = {cell.cell for cell in champion if cell.fingerprints}
    mine: dict[str, set[str]] = {}
    for cell in candidate:
        kept = {p for p in cell.fingerprints if not p.endswith(NONDETERMINISTIC)}
        mine.setdefault(cell.cell, set()).update(kept)
    uncheckable = {name for name in mine if name in texted and name not in theirs}
    unchecked = sorted(
        name
        for name, prompts in mine.items()
        if name not in uncheckable and not prompts & theirs.get(name, set())
    )
    checked = set(mine) - uncheckable - set(unchecked)
    return unchecked if checked else sorted(mine)
