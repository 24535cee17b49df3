"""What a profile is checked for beyond its fields' own validation, said at the key a person
wrote: each ``forbidden`` rule names knobs of the profile and values of their domains
(``check_forbidden``), and every value of every knob renders into a launcher every node can
fill (``check_renderings``), and a cell's ``renamed_from`` names no cell of the profile
(``check_renamed``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cluster.launcher import fill, placeholders
from knobs.errors import KnobError, ProfileError
from knobs.names import did_you_mean, rename_clash
from knobs.records import CellSpec
from knobs.space import ForbiddenCombination, RenderedKnobs, render_knob
from knobs.spec import KnobSpec, Value, as_text, printable
from orchestrator.errors import UsageError

if TYPE_CHECKING:
    from orchestrator.profile import Profile


def check_forbidden(rules: tuple[ForbiddenCombination, ...], knobs: tuple[KnobSpec, ...]) -> None:
    """Each ``forbidden`` rule names knobs of the profile, with values of their domains.

    Raises:
        KnobError: a rule's knob the profile lacks, or a value outside its domain, said at the
            rule's key (``forbidden[0].when``), with what to do.
    """
    by_name = {k.name: k for k in knobs}
    for i, rule in enumerate(rules):
        where = f"forbidden[{i}].when"
        for name, value in rule.when.items():
            spec = by_name.get(name)
            if spec is None:
                known = ", ".join(by_name)
                hint = did_you_mean(name, by_name)
                raise KnobError(
                    f"{where}: unknown knob {printable(name)}; "
                    + (
                        f"known knobs: {known}"
                        if hint is None
                        else f"{hint} (known knobs: {known})"
                    )
                    + "; a rule names knobs of this profile: fix the name, or drop the rule",
                    knob=name,
                )
            try:
                spec.parse(value)
            except KnobError as e:
                raise KnobError(
                    f"{where}: {e}; a rule names values the knob takes: fix the value, or drop "
                    "the rule",
                    knob=name,
                    value=value,
                ) from e


def check_renamed(cells: Sequence[CellSpec]) -> None:
    """Each ``renamed_from`` names another name than the profile's cells have, once.

    Raises:
        ValueError: a cell renamed from its own name, from another cell's, or two from one.
    """
    said = rename_clash(
        "cell", [(c.name, c.renamed_from) for c in cells], ("readings call", "readings carry")
    )
    if said is not None:
        raise ValueError(said)


def check_renderings(profile: Profile, path: Path) -> None:
    """Every value of every knob rendered once, on every node, as a boot would render it: a
    rendering that cannot deploy (a placeholder no node has) is said now, with its profile
    key, rather than when a proposer first picks the value, mid-round.

    Raises:
        ProfileError: a value whose rendering does not fill (names the knob, value, key).
    """
    from orchestrator.settings import runtime_placeholders  # settings imports this module

    try:
        runtime = runtime_placeholders()
    except UsageError:
        return  # an engine's path set wrong in the environment: a boot's testbed says so
    nodes = [(n.name, placeholders(profile.cluster, n, runtime)) for n in profile.cluster.nodes]
    for knob in profile.space.knobs:
        for value in knob.domain():
            for text in _texts(render_knob(knob, value)):
                try:
                    for name, values in nodes:
                        fill(text, values, f"the launcher of {name}")
                except ProfileError as e:
                    raise ProfileError(
                        f"profile {path}: {_rendering_key(knob, value)}: {knob.name} "
                        f"{as_text(value)} renders as {text!r}, and {e} (render it with a "
                        "placeholder a node has, or add the name to the nodes' vars)",
                        path=str(path),
                    ) from e


def _texts(piece: RenderedKnobs) -> list[str]:
    """The strings of a knob's launcher pieces that hold a placeholder."""
    fields = [v for by in piece.json_fields.values() for v in by.values() if isinstance(v, str)]
    return [t for t in (*piece.argv, *piece.env.values(), *fields) if "{" in t]


def _rendering_key(knob: KnobSpec, value: Value) -> str:
    """The profile key a knob's rendering of ``value`` comes from."""
    if knob.render.values is not None and as_text(value) in knob.render.values:
        return f"knobs.{knob.name}.render.values"
    if knob.type == "choice":
        return f"knobs.{knob.name}.choices"
    return f"knobs.{knob.name}.render"
