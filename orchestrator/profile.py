"""Profiles: one YAML file describing a cluster, its launcher, knob space, cells and policies.

This module owns the profile as a whole: its top-level fields validated together (unique
cells, a launcher and knobs that render without a clash), a profile knob's inheritance from
its catalog's spec of the same name (``_merge_knob``), the knob space built once a profile,
and loading a file (an embedded name or a path, YAML refusing a key given twice, the brief
and local workdirs resolved against the profile). The policy sections (objective, verdict,
proposer, approve) and their defaults live in ``orchestrator.profile_sections``; the checks
beyond the fields' own in ``orchestrator.profile_checks``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from cluster.bench_spec import BenchSpec
from cluster.gates import GateSpec
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import LauncherSpec, static_clash
from cluster.ports import resolve_auto_ports
from knobs.catalog import catalog
from knobs.config import Config
from knobs.errors import KnobError, ProfileError
from knobs.names import did_you_mean
from knobs.records import CellSpec
from knobs.space import (
    ForbiddenCombination,
    KnobSpace,
    overlay,
    renamed_clash,
    render_clash,
)
from knobs.spec import KnobSpec, Value
from orchestrator.profile_checks import check_forbidden, check_renamed, check_renderings
from orchestrator.profile_errors import first_error, starting_champion
from orchestrator.profile_names import embedded_profiles
from orchestrator.profile_sections import ApproveSpec, ObjectiveSpec, ProposerSpec, VerdictSpec

#: The fields of a knob spec that make its domain under its type: a profile knob of another
#: type than the catalog's inherits none of them.
DOMAIN_FIELDS = frozenset({"low", "high", "step", "choices", "default"})

#: Each profile's knob space, built once (``Profile.space``), by the profile's id; the profile
#: is held with it, so that the id is not another's. The oldest goes past this many.
_SPACES: dict[int, tuple[Profile, KnobSpace]] = {}
_SPACES_HELD = 16


class Profile(BaseModel):
    """A whole profile, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    description: str = ""
    cluster: ClusterSpec
    #: loaded as the default (no ``--profile``, no ``$ORCHESTRATE_PROFILE``): a command reading
    #: a ledger that holds other clusters but not this one says so (``cli.common.Opened``)
    _by_default: bool = PrivateAttr(default=False)
    model: str = Field(pattern=r"^[A-Za-z0-9_./:-]{1,256}$", description="served model name")
    launcher: LauncherSpec
    knob_catalog: str | None = None
    #: Catalog knobs this profile does not tune: the launcher sets them as written (or leaves
    #: them to the engine's default), and they are neither proposed nor rendered. ``orchestrate
    #: init`` writes it for the catalog knobs a launcher does not set.
    untuned: tuple[str, ...] = ()
    knobs: tuple[KnobSpec, ...] = ()
    forbidden: tuple[ForbiddenCombination, ...] = ()
    champion: dict[str, Value] = Field(
        default_factory=dict, description="the starting champion; missing knobs take defaults"
    )
    cells: tuple[CellSpec, ...] = Field(min_length=1)
    #: how the cells are run (not what they measure): the token deadline
    bench: BenchSpec = BenchSpec()
    gates: GateSpec = GateSpec()
    objective: ObjectiveSpec = ObjectiveSpec()
    verdict: VerdictSpec = VerdictSpec()
    proposer: ProposerSpec = ProposerSpec()
    approve: ApproveSpec = ApproveSpec()
    budget: int = Field(default=6, ge=1, le=10_000)
    ledger_url: str | None = None
    mlflow_uri: str | None = None
    twin_landscape: str | None = Field(
        default=None, description="the landscape whose ground truth `twin optimum` prints"
    )
    restore_champion: bool = Field(
        default=False,
        description="issue #4: after a failed deploy, boot the champion again and leave it "
        "serving (real stacks carry traffic between experiments; the twin serves nobody)",
    )
    #: what loading resolved (``load_profile``): a value's path in the JSON dump, with the
    #: value as resolved and as the file writes it (``as_written``)
    _written: dict[tuple[str | int, ...], tuple[object, object]] = PrivateAttr(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _inherit_catalog_fields(cls, data: object) -> object:
        """A profile knob named like one of its catalog's sets only what it changes: every
        field it leaves out comes from the catalog's spec (render, description, effect prior,
        role, monotone failures, each bound of the domain). Another ``type`` brings its own
        domain (none of the catalog's ``low``, ``high``, ``step``, ``choices``, ``default``);
        ``effect_prior: null`` drops the catalog's prior. A knob renamed from a catalog knob
        (``renamed_from``) inherits that knob's spec so. A name a typo away from a catalog
        knob's is refused unless the entry says ``new: true`` (``_merge_knob``)."""
        if not isinstance(data, dict):
            return data
        name, knobs = data.get("knob_catalog"), data.get("knobs")
        if not isinstance(knobs, list | tuple):
            return data
        try:
            base = {k.name: k for k in catalog(name)} if isinstance(name, str) else {}
        except KnobError:
            base = {}  # the field's own validation says so
        merged = [_merge_knob(knob, base, str(name)) for knob in knobs]
        return {**data, "knobs": merged}

    @model_validator(mode="after")
    def _consistent(self) -> Profile:
        names = [c.name for c in self.cells]
        if len(set(names)) != len(names):
            raise ValueError("cell names must be unique")
        check_renamed(self.cells)
        if self.knob_catalog is None and not self.knobs:
            raise ValueError("a profile needs knob_catalog or knobs")
        declared = [k.name for k in self.knobs]
        twice = sorted({n for n in declared if declared.count(n) > 1})
        if twice:
            raise KnobError(
                f"knobs: {', '.join(twice)} declared twice: the later entry would silently "
                "replace the earlier; rename or drop one"
            )
        knobs = overlay(self._catalog_knobs(), self.knobs)
        declared_names = set(declared)
        for knob in self.knobs:  # before its render clashes with the catalog's: what to do
            was = knob.renamed_from
            if was is not None and was not in declared_names and was in {k.name for k in knobs}:
                raise KnobError(
                    f"knob {knob.name} is renamed_from: {was}, which catalog "
                    f"{self.knob_catalog} still declares: put {was} under untuned: (its history "
                    f"carries over to {knob.name})"
                )
        clash = render_clash(knobs) or renamed_clash(knobs) or static_clash(self.launcher, knobs)
        if clash is not None:
            raise KnobError(clash)
        check_forbidden(self.forbidden, knobs)
        return self

    def _catalog_knobs(self) -> tuple[KnobSpec, ...]:
        """The catalog's knobs less the ``untuned`` ones.

        Raises:
            KnobError: an ``untuned`` name the catalog lacks, or that ``knobs:`` defines too.
        """
        base = catalog(self.knob_catalog) if self.knob_catalog else ()
        names = {k.name for k in base}
        for name in self.untuned:
            if name not in names:
                known = ", ".join(sorted(names))
                hint = did_you_mean(name, names)
                raise KnobError(
                    f"untuned: {name!r} is not a knob of catalog {self.knob_catalog}; "
                    + (f"known: {known}" if hint is None else f"{hint} (known: {known})"),
                    knob=name,
                )
            if any(k.name == name for k in self.knobs):
                raise KnobError(
                    f"knob {name!r} is both under untuned: (left to the launcher, never tuned) "
                    "and under knobs: (tuned): take it out of untuned: to tune it, or out of "
                    "knobs: to leave it to the launcher",
                    knob=name,
                )
        return tuple(k for k in base if k.name not in self.untuned)

    @property
    def by_default(self) -> bool:
        """Whether no ``--profile`` (nor ``$ORCHESTRATE_PROFILE``) chose it."""
        return self._by_default

    @property
    def space(self) -> KnobSpace:
        """The knob space: the catalog (less ``untuned``) overlaid with the profile's knobs;
        built once a profile (it is frozen; a loop asks for it hundreds of times an
        experiment, and a copy of the profile is another profile)."""
        held = _SPACES.get(id(self))
        if held is None or held[0] is not self:
            space = KnobSpace(
                knobs=overlay(self._catalog_knobs(), self.knobs), forbidden=self.forbidden
            )
            if len(_SPACES) >= _SPACES_HELD:
                del _SPACES[next(iter(_SPACES))]
            held = _SPACES[id(self)] = (self, space)
        return held[1]

    def initial_champion(self) -> Config:
        """The starting champion config.

        Raises:
            KnobError: the profile's champion is not a valid config.
        """
        return self.space.config(self.champion, partial=True)

    @property
    def digest(self) -> str:
        """A short digest of the validated profile as its file writes it (``as_written``)."""
        text = json.dumps(self.as_written(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def as_written(self) -> dict[str, Any]:
        """The profile dumped (JSON), each value loading resolved as the file writes it: a
        local node's relative workdir, ``port: auto`` (and ``master_port``), the brief's
        relative path. The same file read from another folder, or its ports picked anew, is
        the same profile: none of these is what a measurement depends on (the launchers'
        digest, ``rendering.digest``, leaves the folder and ports out too; what the proposer
        reads is the brief's text, which no path tells). A value changed since it was resolved
        is dumped as it is now. ``resolved`` undoes none of it."""
        return self._dump(written=True)

    def resolved(self) -> dict[str, Any]:
        """The profile dumped (JSON) as loading resolved it: what a release before the
        fiftieth session's recorded."""
        return self._dump(written=False)

    def _dump(self, *, written: bool) -> dict[str, Any]:
        dumped: dict[str, Any] = self.model_dump(mode="json")
        for path, (was, then) in self._written.items() if written else ():
            holder: Any = dumped
            with contextlib.suppress(LookupError):  # a node dropped since (a copy's)
                for part in path[:-1]:
                    holder = holder[part]
                if holder[path[-1]] == was:
                    holder[path[-1]] = then
        return dumped


def _merge_knob(knob: object, base: dict[str, KnobSpec], catalog_name: str) -> object:
    """A profile's ``knobs:`` entry with what it leaves out taken from the catalog's spec of
    the same name, or of the name it was renamed from (see ``Profile._inherit_catalog_fields``).

    An entry the catalog lacks is written whole; one whose name is a typo away from a catalog
    knob's must say ``new: true``, or it would silently be a second knob writing the same
    field while changes of the one it misspells deploy nothing. ``new: true`` is kept on the
    spec, on a catalog knob too: it also says the knob is no knob the profile dropped,
    renamed (``knob_renames``), where one rendered what it renders.

    Raises:
        KnobError: a name close to a catalog knob's without ``new: true``.
    """
    if not isinstance(knob, dict):
        return knob
    entry = dict(knob)  # ``new`` kept: a new knob is no knob dropped renamed (``knob_renames``)
    name = str(entry.get("name"))
    # a catalog knob renamed (``renamed_from``) is that knob under another name: what the
    # catalog gave it (render, prior, guardrail sides, role) it keeps unless the entry says
    spec = base.get(name) or base.get(str(entry.get("renamed_from")))
    if spec is None:
        hint = did_you_mean(name, base)
        if hint is not None and knob.get("new") is not True:
            raise KnobError(
                f"knob {name!r} is not in catalog {catalog_name}; {hint} "
                "(a new knob says new: true)",
                knob=name,
            )
        return entry
    inherited = spec.model_dump()
    if "type" in entry and entry["type"] != spec.type:
        for field in DOMAIN_FIELDS:
            inherited.pop(field, None)
    return inherited | entry


def default_brief() -> Path:
    """The research brief shipped with orchestrate (what an LLM proposer reads by default)."""
    return Path(str(resources.files("orchestrator") / "profiles" / "brief.md"))


def profile_path(name_or_path: str | None) -> Path:
    """The file of an embedded profile name (default ``twin``) or a path.

    Raises:
        ProfileError: neither a file nor an embedded profile.
    """
    name = name_or_path or os.environ.get("ORCHESTRATE_PROFILE") or "twin"
    candidate = Path(name)
    if candidate.suffix in (".yaml", ".yml") or candidate.exists():
        if not candidate.is_file():
            what = "a directory, not a profile file" if candidate.is_dir() else "no such file"
            raise ProfileError(
                f"profile {name}: {what}; give a profile's path (a .yaml file) or one of "
                + ", ".join(embedded_profiles()),
                path=name,
            )
        return candidate
    embedded = resources.files("orchestrator") / "profiles" / f"{name}.yaml"
    if not embedded.is_file():
        raise ProfileError(
            f"profile {name!r}: not a file and not an embedded profile "
            f"({', '.join(embedded_profiles())})",
            path=name,
        )
    return Path(str(embedded))


def load_profile(name_or_path: str | None = None, *, base_dir: Path | None = None) -> Profile:
    """Load, validate and resolve a profile.

    Relative node workdirs of local nodes are resolved against ``base_dir`` (default: the
    current directory), so the embedded cluster lives next to the ledger.

    Raises:
        ProfileError: unreadable YAML, a schema violation, an invalid champion, or a launcher
            that does not render.
    """
    path = profile_path(name_or_path)
    try:
        data = yaml.load(path.read_text(), Loader=_UniqueKeys)  # noqa: S506 (a SafeLoader)
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"profile {path}: not UTF-8 text (byte {e.start}); save it as UTF-8", path=str(path)
        ) from e
    except (OSError, yaml.YAMLError) as e:
        detail = _yaml_problem(e)
        raise ProfileError(f"profile {path}: cannot read YAML: {detail}", path=str(path)) from e
    if not isinstance(data, dict):
        raise ProfileError(f"profile {path}: expected a mapping at the top", path=str(path))
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        raise ProfileError(
            f"profile {path}: {first_error(e, Profile, data)}", path=str(path)
        ) from e
    except KnobError as e:
        raise ProfileError(f"profile {path}: {e}", path=str(path)) from e
    if profile.cluster.auto_ports and not profile.launcher.mentions("port"):
        # the engine would listen on its own default port while the gates poll the one chosen
        # for the cluster: every boot would wedge, and the config be blamed
        raise ProfileError(
            f"profile {path}: launcher: cluster.port is auto but no launcher token holds "
            "{port}, so the engine would not listen where orchestrate polls: add `--port "
            "{port}` (or your engine's port flag) to launcher.head_argv or launcher.argv",
            path=str(path),
        )
    written = profile
    profile = _resolve_workdirs(profile, base_dir or Path.cwd(), path)
    profile = profile.model_copy(update={"cluster": resolve_auto_ports(profile.cluster)})
    profile = _resolve_brief(profile, path)
    profile._written = _as_written(written, profile)
    try:
        profile.initial_champion()
    except KnobError as e:
        # a domain narrowed under the profile's own starting champion: say where it is
        said = starting_champion(e, profile.space, profile.champion)
        raise ProfileError(f"profile {path}: {said}", path=str(path)) from e
    check_renderings(profile, path)
    try:
        for entry in profile.proposer.sweep or ():
            for knob, value in entry.items():
                profile.space.spec(knob).parse(value)
    except KnobError as e:
        raise ProfileError(f"profile {path}: proposer.sweep: {e}", path=str(path)) from e
    profile._by_default = name_or_path is None
    return profile


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: the later one would
    silently win (a second ``gates:`` dropping the first's gates). Only ``true`` and ``false``
    are booleans (YAML 1.2's core schema): YAML 1.1's ``on``, ``off``, ``yes`` and ``no`` are
    the words written, so an engine's ``choices: [on, off]`` renders ``--flag on`` (read as
    booleans, it rendered ``--flag true``, and ``--set flag=off`` was refused). A setting that
    is a yes-or-no takes those words as it took the booleans (``enabled: yes``)."""

    yaml_implicit_resolvers = {  # noqa: RUF012 (PyYAML's class-level table, copied)
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_UniqueKeys.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
    list("tTfF"),
)


def _yaml_problem(e: OSError | yaml.YAMLError) -> str:
    """What is wrong with a profile's YAML, in one line, with the line and column YAML names."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"{e.problem}{context} at line {mark.line + 1}, column {mark.column + 1}"
    return str(e).splitlines()[0]


def _as_written(written: Profile, resolved: Profile) -> dict[tuple[str | int, ...], Any]:
    """What loading resolved of profile ``written`` (``Profile._written``): each node's
    workdir, the ports of ``port: auto``, the brief's path."""
    out: dict[tuple[str | int, ...], Any] = {}
    for i, (was, now) in enumerate(zip(written.cluster.nodes, resolved.cluster.nodes, strict=True)):
        if was.workdir != now.workdir:
            out[("cluster", "nodes", i, "workdir")] = (now.workdir, was.workdir)
    if written.cluster.auto_ports:
        out[("cluster", "port")] = (resolved.cluster.port, "auto")
        out[("cluster", "master_port")] = (resolved.cluster.master_port, "auto")
    brief = (written.proposer.claude.brief, resolved.proposer.claude.brief)
    if brief[0] != brief[1]:
        out[("proposer", "claude", "brief")] = (brief[1], brief[0])
    return out


def _resolve_brief(profile: Profile, path: Path) -> Profile:
    """The proposer's brief as an absolute path (relative ones are relative to the profile)."""
    brief = profile.proposer.claude.brief
    if brief is None:
        return profile
    resolved = Path(brief) if Path(brief).is_absolute() else path.parent / brief
    if not resolved.is_file():
        raise ProfileError(
            f"profile {path}: proposer.claude.brief: no such file {str(resolved)!r}",
            path=str(path),
        )
    claude = profile.proposer.claude.model_copy(update={"brief": str(resolved.resolve())})
    proposer = profile.proposer.model_copy(update={"claude": claude})
    return profile.model_copy(update={"proposer": proposer})


def _resolve_workdirs(profile: Profile, base: Path, path: Path) -> Profile:
    nodes: list[NodeSpec] = []
    for node in profile.cluster.nodes:
        workdir = node.workdir
        if node.transport == "local" and not workdir.startswith("/"):
            workdir = str((base / workdir).resolve())
        try:
            nodes.append(NodeSpec.model_validate({**node.model_dump(), "workdir": workdir}))
        except ValidationError as e:
            raise ProfileError(
                f"profile {path}: node {node.rank} workdir resolves to {workdir!r}, which a "
                "launcher cannot use; run from a directory whose path has no spaces or quotes",
                path=str(path),
            ) from e
    cluster = profile.cluster.model_copy(update={"nodes": tuple(nodes)})
    return profile.model_copy(update={"cluster": cluster})
