"""``orchestrate init --from launcher.sh``: a profile from the launcher a user already has.

The launcher's `vllm serve` line (the head's; a ``--headless`` line is a worker's) becomes the
profile's launcher: the catalog's knobs it sets, read through their render rules, are the
champion; every other flag stays as written; the per-node values become placeholders
(``--node-rank`` → ``{rank}``, ``--nnodes`` → ``{nnodes}``, ``--master-addr`` →
``{head_host}``, ``--master-port`` → ``{master_port}``, ``--port`` → ``{port}``,
``VLLM_HOST_IP`` → ``{host}``); the exported environment is kept; ``docker run -d`` loses
its ``-d`` (the launcher runs the engine in the foreground: its output is the node's log).
Gates, cells and the verdict start from DOMAIN.md's figures, said so in the file.

Before it is written, the profile is loaded as ``orchestrate`` loads it and rendered for every
node, and each node's command must be the launcher's own (same options and values, order
aside; JSON compared as JSON): a profile that would deploy something else is never written.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from cluster.inventory import ClusterSpec
from cluster.launcher import render_node
from knobs.catalog import CATALOGS, catalog
from knobs.errors import ProfileError
from knobs.spec import Value, as_text
from orchestrator.adopt.knobs import ENGINE_READS, Recognised, recognise
from orchestrator.adopt.serve import NUMBER, Option, Serve, find_serves, read_options
from orchestrator.adopt.shell import Script, read_script
from orchestrator.errors import OrchestrateError, UsageError
from orchestrator.profile import Profile
from orchestrator.profile_errors import first_error

#: Options whose value is the node's, not the launcher's: the placeholder that renders it.
PER_NODE = {
    "--node-rank": "{rank}",
    "--nnodes": "{nnodes}",
    "--master-addr": "{head_host}",
    "--master-port": "{master_port}",
    "--port": "{port}",
}
#: Options only the head has when no worker line says otherwise (DOMAIN.md: rank 0 adds
#: ``--host 0.0.0.0 --port 8000``, ranks 1-3 add ``--headless``).
HEAD_ONLY = frozenset({"--host", "--port", "--api-server-count"})
#: DOMAIN.md's bench cells (10 s warm-up, 30 s, greedy, saturated concurrency).
CELLS = [
    {"name": "code-c1", "category": "code", "concurrency": 1},
    {"name": "prose-c8", "category": "prose", "concurrency": 8},
    {"name": "structured-c4", "category": "structured", "concurrency": 4},
    {"name": "agentic-c4-8k", "category": "agentic", "concurrency": 4, "context_tokens": 8192},
]


class RoundTripError(OrchestrateError):
    """The profile init built does not render back to the launcher's command (a defect of
    init's, not of the launcher): names the node and the difference."""


@dataclass
class Adopted:
    """What init made of a launcher: the profile (validated), its YAML text, and notes."""

    profile: Profile
    text: str
    recognised: Recognised
    #: The head's command as the launcher has it (``prefix``: what runs `vllm serve`).
    head: Serve
    notes: list[str] = field(default_factory=list)


def adopt(
    path: Path,
    *,
    nodes: list[str] | None = None,
    catalog_name: str = "vllm-dflash2",
    name: str | None = None,
    runtime: dict[str, str] | None = None,
    workdir: str | None = None,
) -> Adopted:
    """The profile of the launcher at ``path`` (see the module); ``workdir``: every node's
    (default ``/var/lib/orchestrate/NAME``).

    Raises:
        LauncherReadError: a line or token it cannot read (exit 3).
        ProfileError: no `vllm serve` command, or an unknown catalog (exit 3).
        UsageError: ``--nodes`` does not match the launcher's ``--nnodes`` (exit 2).
        RoundTripError: the profile would not render the launcher's command back.
    """
    try:
        text = path.read_text()
    except UnicodeDecodeError as e:
        raise ProfileError(
            f"{path}: not a launcher script (not UTF-8 text, byte {e.start}); give the shell "
            "script with the `vllm serve` line",
            path=str(path),
        ) from e
    except OSError as e:
        raise ProfileError(f"{path}: cannot read the launcher: {e.strerror}", path=str(path)) from e
    if catalog_name not in CATALOGS:
        raise ProfileError(f"unknown catalog {catalog_name!r}; known: {', '.join(CATALOGS)}")
    script = read_script(text, str(path))
    serves = find_serves(script)
    heads = [s for s in serves if not s.headless]
    workers = [s for s in serves if s.headless]
    if not heads:
        what = "only --headless (worker) lines" if workers else "no `vllm serve` command"
        raise ProfileError(
            f"{path}: {what}; init needs the head's `vllm serve` line (another engine's "
            "profile is written by hand: docs/profile.md)",
            path=str(path),
        )
    head, worker = heads[0], (workers[0] if workers else None)
    notes = [f"line {s.line}: another head command, not taken" for s in heads[1:]]
    notes += [f"line {s.line}: another worker command, not taken" for s in workers[1:]]
    env = _environment(script, head)
    found = recognise(catalog(catalog_name), head, env)
    if worker is not None:
        _same_knobs(script, found, recognise(catalog(catalog_name), worker, env), worker)
    notes += [
        f"{knob}: vLLM reads {flag} {spelt} as {as_text(found.champion[knob])}: adopted as "
        f"that, rendered {flag} {as_text(found.champion[knob])} from now on"
        for knob, (flag, spelt) in found.read_as.items()
    ]
    hosts = _hosts(script, head, nodes)
    argv, head_argv, worker_argv = _argv(script, head, worker, found, len(hosts), notes)
    stem = name or (re.sub(r"[^A-Za-z0-9_.-]+", "-", path.stem).strip("-.") or "adopted")[:64]
    data = _profile(stem, head, hosts, nodes is not None, found, catalog_name, workdir)
    data["launcher"].update(argv=argv, head_argv=head_argv, worker_argv=worker_argv)
    header = _header(path, found, notes, head)
    body = yaml.safe_dump(
        data, sort_keys=False, width=100, default_flow_style=None, allow_unicode=True
    )
    loaded = yaml.safe_load(body)
    try:
        profile = Profile.model_validate(loaded)
    except ValidationError as e:  # a --name, --nodes address or served name a profile refuses
        raise ProfileError(
            f"{path}: the profile would not load: {first_error(e, Profile, loaded)}"
        ) from None
    _round_trip(profile, head, worker, found, runtime or {})
    return Adopted(profile=profile, text=header + body, recognised=found, head=head, notes=notes)


def _environment(script: Script, head: Serve) -> dict[str, str]:
    """The variables the launcher exports (and the head command's ``NAME=value`` words):
    ``VLLM_HOST_IP`` is the node's address, ``{host}``.

    Raises:
        LauncherReadError: an exported value that is not known (a command substitution).
    """
    env: dict[str, str] = {}
    for name, word in script.exports.items():
        if name == "VLLM_HOST_IP":
            env[name] = "{host}"
        elif word.unreadable is not None:
            raise script.fail(word.line, word.raw, word.unreadable)
        else:
            env[name] = word.text
    env.update({k: ("{host}" if k == "VLLM_HOST_IP" else v) for k, v in head.env.items()})
    return env


def _same_knobs(script: Script, head: Recognised, worker: Recognised, line: Serve) -> None:
    """The worker's line sets every knob the head's does, to the same value (a profile renders
    one champion for every node).

    Raises:
        LauncherReadError: a knob set differently, or on one line only.
    """
    for knob in sorted(set(head.champion) | set(worker.champion)):
        mine, theirs = head.champion.get(knob), worker.champion.get(knob)
        if mine == theirs:
            continue
        shown = "nothing" if theirs is None else as_text(theirs)
        raise script.fail(
            line.line,
            knob,
            f"the worker's line sets {knob} to {shown}, the head's to "
            f"{'nothing' if mine is None else as_text(mine)}: a profile renders one value for "
            "every node",
        )


def _hosts(script: Script, head: Serve, nodes: list[str] | None) -> list[str]:
    """The nodes' addresses, the head's first.

    Raises:
        UsageError: the launcher runs more nodes than ``nodes`` names, or fewer.
        LauncherReadError: ``--nnodes`` is not a number.
    """
    given = head.get("--nnodes") or "1"
    if not given.isdigit() or int(given) < 1:
        raise script.fail(head.line, f"--nnodes {given}", "not a node count")
    count = int(given)
    if nodes is None:
        if count > 1:
            raise UsageError(
                f"the launcher runs {count} nodes (--nnodes {count}); name them, head first: "
                "--nodes HEAD,WORKER,…"
            )
        return [head.get("--master-addr") or "127.0.0.1"]
    if len(nodes) != count:
        raise UsageError(
            f"--nodes names {len(nodes)} node(s); the launcher runs {count} (--nnodes {count})"
        )
    return nodes


def _argv(
    script: Script,
    head: Serve,
    worker: Serve | None,
    found: Recognised,
    nnodes: int,
    notes: list[str],
) -> tuple[list[str], list[str], list[str]]:
    """The launcher's ``argv``, ``head_argv`` and ``worker_argv``: what every node runs, and
    what only the head or only a worker adds."""
    rendered = {o.flag for o in head.options} - {o.flag for o in found.options}
    mine = [_per_node(o) for o in found.options]
    prefix = [_host_env(t) for t in head.prefix]
    if worker is None:
        if nnodes == 1:
            return [*prefix, *_model(head), *_flat(mine)], [], []
        common = [o for o in mine if o.flag not in HEAD_ONLY]
        only = [o for o in mine if o.flag in HEAD_ONLY]
        notes.append(
            "no --headless line: the workers run the head's command without "
            + (" ".join(sorted({o.flag for o in only})) or "nothing")
            + " and with --headless (DOMAIN.md)"
        )
        return [*prefix, *_model(head), *_flat(common)], _flat(only), ["--headless"]
    theirs = [_per_node(o) for o in worker.options if o.flag not in rendered]
    if [_host_env(t) for t in worker.prefix] != prefix or worker.model != head.model:
        raise script.fail(
            worker.line,
            " ".join(worker.prefix[-3:]),
            "the worker's line runs another command than the head's (init reads launchers "
            "whose lines differ only in vLLM's options)",
        )
    common = [o for o in mine if o in theirs]
    return (
        [*prefix, *_model(head), *_flat(common)],
        _flat([o for o in mine if o not in common]),
        _flat([o for o in theirs if o not in common]),
    )


def _per_node(option: Option) -> Option:
    placeholder = PER_NODE.get(option.flag)
    return option if placeholder is None else Option(option.flag, placeholder)


def _host_env(token: str) -> str:
    """``VLLM_HOST_IP=…`` given to a container is the node's address."""
    return "VLLM_HOST_IP={host}" if token.startswith("VLLM_HOST_IP=") else token


def _model(serve: Serve) -> list[str]:
    return [serve.model] if serve.model else []


def _flat(options: list[Option]) -> list[str]:
    return [t for o in options for t in o.tokens()]


def _profile(
    name: str,
    head: Serve,
    hosts: list[str],
    remote: bool,
    found: Recognised,
    catalog_name: str,
    workdir: str | None,
) -> dict[str, Any]:
    """The profile's fields but the launcher's argv (see ``adopt``)."""
    workdir = workdir or f"/var/lib/orchestrate/{name}"
    nodes: list[dict[str, Any]] = []
    for rank, host in enumerate(hosts):
        node: dict[str, Any] = {"rank": rank, "host": host, "workdir": workdir}
        if remote:
            node.update(transport="ssh", ssh={"host": host})
        nodes.append(node)
    served = (head.get("--served-model-name") or head.model_name).split()[0]
    multi = len(hosts) > 1
    gates: dict[str, Any] = {
        "boot_timeout_s": 2100 if multi else 1200,
        "stall_s": 900,
        "poll_s": 20,
        "stop_grace_s": 45,
    }
    if multi:
        gates.update(
            worker_ready_line="non-default args: .*'headless': True", worker_ready_timeout_s=600
        )
    if head.container is not None:
        gates["stop_hook"] = ["docker", "stop", "-t", "30", head.container]
        if "--rm" not in head.prefix:  # the next boot's `docker run --name` needs the name
            stop = f"docker stop -t 30 {shlex.quote(head.container)} >/dev/null 2>&1"
            gates["stop_hook"] = ["bash", "-c", f"{stop}; docker rm {shlex.quote(head.container)}"]
    spec_config = found.json_flags.get("--speculative-config", {})
    if spec_config.get("method") == "dflash" or "dflash" in (
        head.get("--speculative-config") or ""
    ):
        gates["must_log"] = ["Loaded DFlash mask embedding for mask_token_id"]
    data: dict[str, Any] = {
        "name": name,
        "description": f"adopted by `orchestrate init` from {head.prefix[0]} … serve "
        f"{head.model_name}",
        "model": served,
        "restore_champion": True,
        "cluster": {
            "name": name,
            "port": int(head.get("--port") or 8000),
            "master_port": int(head.get("--master-port") or 29520),
            "nodes": nodes,
        },
        "launcher": {"argv": [], "head_argv": [], "worker_argv": [], "env": found.env},
        "knob_catalog": catalog_name,
        "untuned": sorted([*found.untuned, *found.unset]),
        "champion": found.champion,
        "cells": [{**c, "max_tokens": 512, "warmup_s": 10, "duration_s": 30} for c in CELLS],
        "gates": gates,
        "verdict": {
            "confidence": 0.95,
            "max_boots": 3,
            "noise": {"run_to_run": 0.02, "boot_to_boot": 0.05},
        },
        "proposer": {"kind": "optuna", "seed": 0},
        "approve": {"mode": "ask"},
        "budget": 6,
    }
    if found.json_flags:
        data["launcher"]["json_flags"] = found.json_flags
    if not found.env:
        del data["launcher"]["env"]
    return data


def _header(path: Path, found: Recognised, notes: list[str], head: Serve) -> str:
    lines = [
        f"Written by `orchestrate init --from {path.name}` from line {head.line} of that launcher.",
        "Knobs recognised (the starting champion): "
        + (", ".join(f"{k}={as_text(v)}" for k, v in found.champion.items()) or "none"),
    ]
    lines += [f"Untuned: {k}: {why}." for k, why in found.untuned.items()]
    if found.unset:
        lines.append(
            f"Not set by the launcher, so not tuned: {', '.join(found.unset)} (each stays the "
            "engine's default)."
        )
    lines += [
        f"Dropped: docker run {t}: the engine runs in the foreground, with no terminal."
        for t in head.dropped
    ]
    lines += [f"Note: {n}." for n in notes]
    lines += [
        "Gates, cells and the verdict's noise are DOMAIN.md's starting figures (boot 16-22 min",
        "on four nodes, 6-10 on two; +-2 % run to run, +-5 % boot to boot): check them against",
        "your stack. `orchestrate cluster up --dry-run --profile THIS` shows each node's command.",
    ]
    return "".join(f"# {line}\n" for line in lines)


def _round_trip(
    profile: Profile, head: Serve, worker: Serve | None, found: Recognised, runtime: dict[str, str]
) -> None:
    """Each node's rendered command is the launcher's own (see the module).

    Raises:
        RoundTripError: a node's command differs; names the node and the difference.
    """
    config = profile.initial_champion()
    cluster: ClusterSpec = profile.cluster
    for node in cluster.nodes:
        source = head if node.rank == 0 else worker
        if source is None:
            continue  # an inferred worker line: nothing to compare with
        got = render_node(profile.launcher, profile.space, config, cluster, node, runtime)
        want = _expected(source, node.rank, cluster, found)
        have = _canonical(list(got.argv), len(source.prefix))
        if have != want:
            missing = sorted(set(want[1]) - set(have[1]))
            extra = sorted(set(have[1]) - set(want[1]))
            raise RoundTripError(
                f"init's profile renders another command for {node.name} than line "
                f"{source.line}: missing {missing or want[0]}, extra {extra or have[0]}"
            )


def _expected(
    serve: Serve, rank: int, cluster: ClusterSpec, found: Recognised
) -> tuple[list[str], list[str]]:
    """``serve``'s command as ``_canonical`` reads it, with the node's own values and each
    value spelt as vLLM reads it (``found.read_as``) as the knob's value it reads it as."""
    read = {flag: ENGINE_READS[flag][spelt] for flag, spelt in found.read_as.values()}
    values = {
        "{rank}": str(rank),
        "{nnodes}": str(len(cluster.nodes)),
        "{head_host}": cluster.head.host,
        "{master_port}": str(cluster.master_port),
        "{port}": str(cluster.port),
    }
    options = [
        Option(o.flag, read.get(o.flag, values.get(PER_NODE.get(o.flag, ""), o.value)))
        for o in serve.options
    ]
    host = cluster.nodes[rank].host
    prefix = [t.replace("{host}", host) for t in (_host_env(t) for t in serve.prefix)]
    return _canonical([*prefix, *_model(serve), *_flat(options)], len(prefix))


def _canonical(argv: list[str], split: int) -> tuple[list[str], list[str]]:
    """A command as (what runs `vllm serve` and the model, the options sorted, JSON values
    re-serialised); ``split``: where the words after ``serve`` start."""
    model, options = read_options(argv[split:])
    out = []
    for o in options:
        value: Value | None = o.value
        if o.value is not None and o.value.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.dumps(json.loads(o.value), sort_keys=True)
        elif o.value is not None and NUMBER.match(o.value):
            value = f"{float(o.value):.12g}"  # 0.80 and 0.8 are one value
        out.append(f"{o.flag}={value}" if value is not None else o.flag)
    return [*argv[:split], model], sorted(out)
