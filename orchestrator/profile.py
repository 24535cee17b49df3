"""Profiles: one YAML file describing a cluster, its launcher, knob space, cells and policies."""

from __future__ import annotations

import hashlib
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents import ClaudeOptions
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
    render_clash,
)
from knobs.spec import KnobSpec, Value
from orchestrator.profile_checks import check_forbidden, check_renderings
from orchestrator.profile_errors import first_error
from orchestrator.profile_names import ApproveMode, ProposerKind, embedded_profiles


class ObjectiveSpec(BaseModel):
    """What the loop maximises: a cell metric summed over the profile's cells."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Literal["output_throughput"] = "output_throughput"
    aggregate: Literal["sum"] = "sum"


class NoiseSpec(BaseModel):
    """The noise the profile expects before the ledger has taught the model better."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_to_run: float = Field(default=0.02, gt=0, le=1, description="relative sd of one cell run")
    boot_to_boot: float = Field(default=0.05, gt=0, le=1, description="relative sd across boots")
    prior_weight: float = Field(
        default=8.0, ge=0, description="degrees of freedom the prior counts for"
    )


class VerdictSpec(BaseModel):
    """How a candidate is judged against the champion.

    ``sequential`` (default): Bayesian, with a spike-and-slab prior on the change's effect
    (a share ``prior_null`` of changes do nothing, the rest are spread ``prior_effect_pct``),
    boots added while undecided, and a keep only after a confirmation boot with the champion
    re-measured. ``threshold``: the common practice — keep if one run beats the champion by
    more than ``threshold_pct`` (kept for comparison; it keeps noise).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Literal["sequential", "threshold"] = "sequential"
    threshold_pct: float = Field(
        default=2.0, ge=0, le=100, description="threshold policy: keep above this gain"
    )
    confidence: float = Field(
        default=0.95, gt=0.5, lt=1, description="keep when P(gain > 0) reaches this"
    )
    equivalence_pct: float = Field(
        default=1.0, ge=0, le=50, description="gains below this are not worth a new champion"
    )
    futility: float = Field(
        default=0.25, gt=0, lt=1, description="discard when P(gain > equivalence) falls below"
    )
    prior_null: float = Field(
        default=0.5, ge=0, lt=1, description="share of changes that do nothing (the spike)"
    )
    prior_effect_pct: float = Field(
        default=15.0, gt=0, le=100, description="spread of a change's effect (the slab)"
    )
    knob_priors: bool = Field(
        default=True,
        description="judge a one-knob change with its knob's effect_prior where its spec "
        "declares one (CUDA graphs and K always do something; adapter rank rarely does)",
    )
    pool_values: bool = Field(
        default=True,
        description="judge a value of an ordered knob (K, MNBT) together with the other values "
        "of the knob measured against the same champion (off: on its own boots alone)",
    )
    second_looks: int = Field(
        default=2,
        ge=0,
        le=5,
        description="a change the verdict stopped at its boot cap or on futility while it still "
        "promises second_look_gain_pct may be looked at again this many times under one "
        "champion; its earlier boots count in the next verdict",
    )
    second_look_gain_pct: float = Field(
        default=2.0,
        gt=0,
        le=50,
        description="what a change must still promise (E[max(0, gain)] under its posterior) to "
        "be looked at again",
    )
    max_boots: int = Field(
        default=3, ge=1, le=20, description="candidate boots before inconclusive"
    )
    confirm_boots: int = Field(default=1, ge=0, le=10)
    predictive_futility: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="discard when the chance that the boots left reach a keep falls below this",
    )
    balance_boots: bool = Field(
        default=True,
        description="while undecided, boot the champion rather than the candidate when it has "
        "fewer boots (every comparison shares its error; its boots serve every later verdict)",
    )
    reboot_slow_clocks: bool = Field(
        default=True,
        description="a boot with a node's clocks off measured the node, not the config: set it "
        "aside and boot the config again (off: the verdict rules it invalid at once); either "
        "way, a run of clocks off that chance at the cluster's rate does not explain (four in a "
        "row or more) stops the round",
    )
    noise: NoiseSpec = NoiseSpec()
    max_error_rate: float = Field(default=0.0, ge=0, le=1)
    check_greedy: bool = Field(
        default=True,
        description="invalid when greedy outputs differ from the champion's (off only to "
        "reproduce loops that do not check)",
    )
    ttft_p90_regression_pct: float | None = Field(
        default=50.0, ge=0, description="a guardrail: discard if any cell's TTFT p90 grows more"
    )
    ttft_p90_min_increase_ms: float = Field(
        default=50.0,
        ge=0,
        description="the TTFT guardrail ignores growth smaller than this many milliseconds (on a "
        "fast engine 25 -> 63 ms is +150% and nothing a user feels; one boot's scheduling luck)",
    )
    drift_every: int = Field(
        default=12, ge=1, description="re-measure the champion after this many decided experiments"
    )
    champion_boots: int = Field(
        default=3,
        ge=1,
        le=10,
        description="re-measure the champion after each decided experiment until it has this "
        "many boots (every comparison shares its error)",
    )
    drift_max_age_s: float | None = Field(
        default=None, gt=0, description="…or when its last measurement is older than this"
    )
    confirm_drift: bool = Field(
        default=True,
        description="a re-measurement that flags a drift is followed by one more boot of the "
        "champion, and its level re-based only when that boot confirms the drift (off only to "
        "reproduce the loop before issue #18, which re-based on the flagged boot alone)",
    )
    keep_boots_sigmas: float | None = Field(
        default=1.5,
        gt=0,
        description="a kept change's boots were chosen for reading high: when the new "
        "champion's first boot of its own reads this many standard errors below them, they "
        "leave its level (recorded as an event) and it is measured afresh (null: they stay)",
    )
    infra_retries: int = Field(
        default=6,
        ge=0,
        le=10,
        description="a boot that failed for the infrastructure's reasons (a node unreachable, "
        "auth, an upload, a worker missing from the rendezvous) is taken again this many times "
        "before the round stops with exit 5, the experiment left undecided (the default rides "
        "out a node's reboot: about 25 minutes of waits)",
    )
    infra_backoff_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="the wait before the first such retry; it doubles for each next one, up "
        "to 10 minutes a wait",
    )


class ProposerSpec(BaseModel):
    """Who proposes, with its settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProposerKind = "optuna"
    seed: int = 0
    sweep: tuple[dict[str, Value], ...] | None = None
    #: The Claude and hybrid proposers' settings: model, max_tries, max_usd_per_round (the
    #: LLM spend cap of a round), brief (a markdown file; relative to the profile), API
    #: retries and timeout, prices. See ``agents.ClaudeOptions``.
    claude: ClaudeOptions = ClaudeOptions()


class ApproveSpec(BaseModel):
    """The veto gate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: ApproveMode = "auto"
    #: queue: how long a proposal waits for a person (None: for ever) …
    timeout_s: float | None = Field(default=None, gt=0)
    #: … and what the timeout decides.
    on_timeout: Literal["veto", "approve"] = "veto"
    #: queue: timeout vetoes in a row after which the round pauses (nobody is deciding).
    max_timeouts: int = Field(default=3, ge=1, le=1000)


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

    @model_validator(mode="before")
    @classmethod
    def _inherit_catalog_fields(cls, data: object) -> object:
        """A profile knob named like one of its catalog's sets only what it changes: every
        field it leaves out comes from the catalog's spec (render, description, effect prior,
        role, monotone failures, each bound of the domain). Another ``type`` brings its own
        domain (none of the catalog's ``low``, ``high``, ``step``, ``choices``, ``default``);
        ``effect_prior: null`` drops the catalog's prior. A name a typo away from a catalog
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
        if self.knob_catalog is None and not self.knobs:
            raise ValueError("a profile needs knob_catalog or knobs")
        knobs = overlay(self._catalog_knobs(), self.knobs)
        clash = render_clash(knobs) or static_clash(self.launcher, knobs)
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
                raise KnobError(f"untuned: {name!r} is also defined under knobs:", knob=name)
        return tuple(k for k in base if k.name not in self.untuned)

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
        """A short digest of the validated profile."""
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _merge_knob(knob: object, base: dict[str, KnobSpec], catalog_name: str) -> object:
    """A profile's ``knobs:`` entry with what it leaves out taken from the catalog's spec of
    the same name (see ``Profile._inherit_catalog_fields``).

    An entry the catalog lacks is written whole; one whose name is a typo away from a catalog
    knob's must say ``new: true``, or it would silently be a second knob writing the same
    field while changes of the one it misspells deploy nothing.

    Raises:
        KnobError: a name close to a catalog knob's without ``new: true``, or ``new: true``
            on a knob the catalog has.
    """
    if not isinstance(knob, dict):
        return knob
    entry = {k: v for k, v in knob.items() if k != "new"}
    name = str(entry.get("name"))
    spec = base.get(name)
    if spec is None:
        hint = did_you_mean(name, base)
        if hint is not None and knob.get("new") is not True:
            raise KnobError(
                f"knob {name!r} is not in catalog {catalog_name}; {hint} "
                "(a new knob says new: true)",
                knob=name,
            )
        return entry
    if "new" in knob:
        raise KnobError(
            f"knob {name!r} is in catalog {catalog_name}: new: true is for a knob it lacks",
            knob=name,
        )
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
    profile = _resolve_workdirs(profile, base_dir or Path.cwd(), path)
    profile = profile.model_copy(update={"cluster": resolve_auto_ports(profile.cluster)})
    profile = _resolve_brief(profile, path)
    try:
        profile.initial_champion()
    except KnobError as e:
        # a domain narrowed under the profile's own starting champion: say where it is
        raise ProfileError(
            f"profile {path}: champion: {e} (the starting config: give it a value the knob "
            "allows, or leave the knob out for its default; a ledger's champion keeps its own)",
            path=str(path),
        ) from e
    check_renderings(profile, path)
    try:
        for entry in profile.proposer.sweep or ():
            for knob, value in entry.items():
                profile.space.spec(knob).parse(value)
    except KnobError as e:
        raise ProfileError(f"profile {path}: proposer.sweep: {e}", path=str(path)) from e
    return profile


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping: the later one would
    silently win (a second ``gates:`` dropping the first's gates)."""

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


def _yaml_problem(e: OSError | yaml.YAMLError) -> str:
    """What is wrong with a profile's YAML, in one line, with the line and column YAML names."""
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        context = f" ({e.context})" if e.context else ""
        return f"{e.problem}{context} at line {mark.line + 1}, column {mark.column + 1}"
    return str(e).splitlines()[0]


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
