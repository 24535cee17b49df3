"""Launcher rendering: a profile's command template + a config → one bash script per node.

Every token is validated (knob values by ``knobs``, placeholders by the inventory) and then
quoted with ``shlex.quote``; the script never interpolates a raw string.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.inventory import ClusterSpec, NodeSpec
from knobs.config import Config
from knobs.errors import ProfileError
from knobs.space import KnobSpace
from knobs.spec import SAFE_TOKEN, KnobSpec, Value

_PLACEHOLDER = re.compile(r"\{([a-z_][a-z0-9_]*)\}")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
# argv tokens may hold more than knob values (a model name, a JSON literal from the profile)
_ARG = re.compile(r"^[^\x00-\x1f\x7f]{1,4096}$")

#: Files a node keeps in its workdir.
SCRIPT = "launcher.sh"
LOG = "engine.log"
PIDFILE = "engine.pid"
#: The engine's exit status, written by the wrapper that waits on it (``start_command``):
#: ``<wrapper pid> <status>``, the status as ``wait`` gives it (128+N for a death by signal N).
#: An engine started by an older release has none.
EXIT = "engine.exit"
#: Written by orchestrate's own stop (``stop_command``, ``marked``) before it signals the
#: engine: ``<pid>``. An engine that died of a signal with this file naming its pid died of ours.
STOPPING = "engine.stopping"
#: The environment variable every process a launcher starts inherits: the pid of its start's
#: process group (``start_command``), so that an engine that escaped the group (a daemon, a
#: double fork, setsid) is still known as that start's (``stop_command``).
MARK = "ORCHESTRATE_ENGINE"
#: The node's own journal of what orchestrate did to it (issue #4): one line per start and
#: stop, stamped by the node's clock. ``<unix time> <event> rank=R rc=N <last output line>``.
EVENTS = "engine.events"


class LauncherSpec(BaseModel):
    """The engine command of a profile, with ``{placeholders}``.

    Placeholders: ``rank``, ``nnodes``, ``host`` (this node), ``head_host``, ``port``,
    ``master_port``, ``workdir``, ``cluster``, ``cluster_token`` (the cluster's rendezvous
    token, issue #17), ``python`` and ``twin_models`` (local runtime), and every key of the
    node's ``vars``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    argv: tuple[str, ...] = Field(min_length=1)
    head_argv: tuple[str, ...] = ()
    worker_argv: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    json_flags: dict[str, dict[str, Value]] = Field(
        default_factory=dict, description="base objects of JSON flags such as --speculative-config"
    )

    @model_validator(mode="after")
    def _tokens(self) -> LauncherSpec:
        for token in (*self.argv, *self.head_argv, *self.worker_argv):
            if not _ARG.match(token):
                raise ValueError(f"launcher token {token!r} has control characters")
        for name, value in self.env.items():
            if not _ENV_NAME.match(name):
                raise ValueError(f"launcher env name {name!r} is not an environment variable name")
            if not _ARG.match(value):
                raise ValueError(f"launcher env {name} has control characters")
        for flag in self.json_flags:
            if not SAFE_TOKEN.match(flag):
                raise ValueError(f"JSON flag {flag!r} is not a flag name")
        return self

    def mentions(self, placeholder: str) -> bool:
        """Whether any token, variable or JSON value of the launcher holds ``{placeholder}``."""
        texts = [*self.argv, *self.head_argv, *self.worker_argv, *self.env.values()]
        texts += [v for obj in self.json_flags.values() for v in obj.values() if isinstance(v, str)]
        return any(f"{{{placeholder}}}" in text for text in texts)


class RenderedLauncher(BaseModel):
    """One node's launcher: its argv, environment and the script that runs them."""

    model_config = ConfigDict(frozen=True)

    rank: int
    argv: tuple[str, ...]
    env: dict[str, str]
    script: str


def placeholders(
    cluster: ClusterSpec, node: NodeSpec, runtime: Mapping[str, str]
) -> dict[str, str]:
    """The placeholder values for ``node``: runtime defaults, then inventory, then node vars."""
    values = dict(runtime)
    values.update(
        rank=str(node.rank),
        nnodes=str(len(cluster.nodes)),
        host=node.host,
        head_host=cluster.head.host,
        port=str(cluster.port),
        master_port=str(cluster.master_port),
        workdir=node.workdir,
        cluster=cluster.name,
        cluster_token=cluster.token,
    )
    values.update(node.vars)
    return values


def fill(text: str, values: Mapping[str, str], where: str) -> str:
    """``text`` with every ``{name}`` replaced.

    Raises:
        ProfileError: an unknown placeholder (names the known ones).
    """

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            known = ", ".join(sorted(values))
            raise ProfileError(f"{where}: unknown placeholder {{{name}}}; known: {known}")
        return values[name]

    return _PLACEHOLDER.sub(one, text)


def _fill_value(value: Value, values: Mapping[str, str], where: str) -> Value:
    return fill(value, values, where) if isinstance(value, str) else value


def static_clash(spec: LauncherSpec, knobs: Sequence[KnobSpec]) -> str | None:
    """A knob that renders what the launcher already sets for every config (a flag of its
    argv, a JSON flag it fills, an environment variable of its env): the engine would get it
    twice and one of the two would silently win, so a change of the knob might deploy
    nothing. In words, saying what to do; else None."""
    fixed = [t for t in (*spec.argv, *spec.head_argv, *spec.worker_argv) if t.startswith("-")]

    def in_argv(flag: str) -> bool:
        return any(t == flag or t.startswith(flag + "=") for t in fixed)

    for knob in knobs:
        how = knob.render
        flags = {
            "flag": [str(how.flag)],
            "json_field": [str(how.flag)],
            "switch": [t.split("=")[0] for t in (*how.when_true, *how.when_false)],
            "env": [],
        }[how.kind]
        for flag in flags:
            if flag.startswith("-") and in_argv(flag):
                return (
                    f"knob {knob.name} renders {flag}, which launcher.argv sets for every "
                    "config too: take it out of the argv (the knob's value is what deploys)"
                )
        if how.kind == "flag" and how.flag in spec.json_flags:
            return (
                f"knob {knob.name} renders {how.flag}, which launcher.json_flags fills as "
                "JSON: make the knob a json_field of it, or drop the JSON flag"
            )
        if how.kind == "json_field" and how.field in spec.json_flags.get(str(how.flag), {}):
            return (
                f"knob {knob.name} writes {how.flag} field {how.field}, which "
                "launcher.json_flags sets for every config too: take the field out of "
                "launcher.json_flags (the knob's value is what deploys)"
            )
        names = [how.env] if how.kind == "env" else [*how.env_when_true, *how.env_when_false]
        for name in names:
            if name in spec.env:
                return (
                    f"knob {knob.name} sets ${name}, which launcher.env sets for every config "
                    "too: take it out of launcher.env (the knob's value is what deploys)"
                )
    return None


def render_node(
    spec: LauncherSpec,
    space: KnobSpace,
    config: Config,
    cluster: ClusterSpec,
    node: NodeSpec,
    runtime: Mapping[str, str],
) -> RenderedLauncher:
    """The launcher of ``node`` running ``config``.

    Raises:
        ProfileError: an unknown placeholder.
        KnobError: the config cannot be rendered.
    """
    values = placeholders(cluster, node, runtime)
    where = f"launcher of {node.name}"
    knobs = space.render(config)
    role = spec.head_argv if node.rank == 0 else spec.worker_argv
    argv = [fill(t, values, where) for t in (*spec.argv, *role)]
    argv += [fill(t, values, where) for t in knobs.argv]
    for flag in sorted(set(spec.json_flags) | set(knobs.json_fields)):
        merged = {**spec.json_flags.get(flag, {}), **knobs.json_fields.get(flag, {})}
        filled = {k: _fill_value(v, values, where) for k, v in merged.items()}
        argv += [flag, json.dumps(filled, separators=(",", ":"))]
    env = {k: fill(v, values, where) for k, v in spec.env.items()}
    env.update({k: fill(v, values, where) for k, v in knobs.env.items()})
    return RenderedLauncher(
        rank=node.rank,
        argv=tuple(argv),
        env=env,
        script=script_text(cluster, node, config, argv, env),
    )


def script_text(
    cluster: ClusterSpec, node: NodeSpec, config: Config, argv: list[str], env: Mapping[str, str]
) -> str:
    """The bash launcher: cd to the workdir, export the environment, exec the engine."""
    lines = [
        "#!/usr/bin/env bash",
        f"# orchestrate launcher: cluster {cluster.name}, {node.name} (rank {node.rank})",
        f"# config {config.key}: {config.to_json()}",
        "set -eu",
        f"cd {shlex.quote(node.workdir)}",
    ]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    lines.append("exec " + " \\\n  ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


#: Shell that sets ``st`` to the start time of process ``$pid`` (field 22 of its
#: ``/proc/PID/stat``, in clock ticks since boot; the command name before it may hold spaces),
#: empty where there is no such process or no ``/proc``.
_START_TIME = (
    'st=$(cat "/proc/$pid/stat" 2>/dev/null) && st=${st##*) } && set -- $st && st=${20:-}; '
)
#: Shell that reads the pid file into ``pid`` and ``born`` (the engine's start time when it was
#: started; empty in a pid file of an older orchestrate), and a function ``ours`` that fails
#: when process ``$pid`` is another's: it lives, but started at another time than the engine
#: did (the pid was reused: after a node's reboot, or months later). A group whose leader is
#: gone is still the engine's: Linux reuses no pid while a process group holds it.
_READ_PID = (
    f'read -r pid born <{PIDFILE} 2>/dev/null || pid=""; '
    'ours() { [ -n "$born" ] || return 0; '
    + _START_TIME
    + '[ -z "$st" ] || [ "$st" = "$born" ]; }; '
)


#: Shell function ``live``: whether the process group ``$pid`` has a member that is not a
#: zombie. ``kill -0`` succeeds on a group of zombies: an engine that exited but whose parent
#: (init, once its starter is gone) has not reaped it yet. An init that reaps late (a sandbox's,
#: a second later) made every stop wait for it; a container whose PID 1 never reaps (no
#: ``--init``) made every stop wait out its grace and the SIGKILL's 5 s, then say ``alive``.
#: The group's leader is read first, then the members found are remembered (``members``), so
#: that a stop's every tick reads their ``/proc`` entries only, and all of ``/proc`` again only
#: once none of them runs. Where the node has no ``/proc``, ``kill -0`` stands.
_LIVE = (
    "members=; "
    'live() { kill -0 -- "-$pid" 2>/dev/null || return 1; [ -r /proc/self/stat ] || return 0; '
    "local f p s; for p in ${members:-$pid}; do "
    'read -r s 2>/dev/null <"/proc/$p/stat" || continue; s=${s##*) }; set -- $s; '
    '[ "${3:-}" = "$pid" ] && [ "$1" != Z ] && return 0; done; members=; '
    "for f in /proc/[0-9]*/stat; do "
    'read -r s 2>/dev/null <"$f" || continue; s=${s##*) }; set -- $s; '
    '[ "${3:-}" = "$pid" ] && [ "$1" != Z ] || continue; '
    'p=${f#/proc/}; members="$members ${p%/stat}"; done; [ -n "$members" ]; }; '
)


def start_command(node: NodeSpec) -> list[str]:
    """argv that starts the node's launcher detached (its own session; survives the caller)
    and records the pid of its process group, and its start time (so that a stop never
    signals a process that took the pid over: ``stop_command``). The group's leader is a
    wrapper that waits on the engine and writes its exit status (``EXIT``), so that an engine
    killed from outside can be told from one that crashed (``cluster.engine_process``)."""
    wd = shlex.quote(node.workdir)
    # the wrapper's own pid ($$) is the pid file's: a status file is read only for its engine
    wrapper = shlex.quote(f'export {MARK}=$$; bash {SCRIPT}; echo "$$ $?" >{EXIT}')
    # the pid is reported only once the engine leads its own process group: a liveness check
    # that came earlier would find no group and call a starting engine dead
    body = (
        f"cd {wd} || exit 1; rm -f {EXIT} {STOPPING}; "
        f"setsid bash -c {wrapper} >{LOG} 2>&1 </dev/null & pid=$!; "
        'for i in $(seq 100); do kill -0 -- "-$pid" 2>/dev/null && break; sleep 0.02; done; '
        + _START_TIME
        + f'echo "$pid $st" >{PIDFILE}; echo "$pid $st"'
    )
    return ["bash", "-c", body]


def started(stdout: str) -> tuple[int, str] | None:
    """The engine ``start_command`` printed it started: its process group's pid and its start
    time (``''`` where the node has no ``/proc``); None where it printed something else."""
    fields = stdout.strip().split()
    if not 1 <= len(fields) <= 2 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), fields[1] if len(fields) == 2 else ""


def marked(node: NodeSpec, argv: Sequence[str]) -> list[str]:
    """argv that runs ``argv`` (a profile's stop hook: ``docker stop``) as it is, after marking
    the stop as orchestrate's own (``STOPPING``, when a pid file names an engine): the engine
    it ends died of our signal, never of a person's."""
    pidfile = shlex.quote(f"{node.workdir}/{PIDFILE}")
    stopping = shlex.quote(f"{node.workdir}/{STOPPING}")
    mark = f'read -r pid _ <{pidfile} 2>/dev/null && echo "$pid" >{stopping} 2>/dev/null; '
    return ["bash", "-c", mark + 'exec "$@"', "stop-hook", *argv]


#: Shell that prints ``exited AGE`` for the engine ``$pid`` whose group is gone: AGE the seconds
#: since its wrapper wrote its exit status (``EXIT``), by the node's own clock; ``exited``
#: alone where none was written for it (its wrapper killed too, a reboot).
_EXITED = (
    f'read -r xpid _ <{EXIT} 2>/dev/null || xpid=""; '
    f'if [ "$xpid" = "$pid" ] && m=$(stat -c %Y {EXIT} 2>/dev/null); '
    'then echo "exited $(( $(date +%s) - m ))"; else echo exited; fi; '
)


#: Shell that stops what is left of the engine ``$pid`` once its group is gone: every process
#: whose environment bears its start's mark (``MARK``: one that escaped the group), each said
#: as ``escaped PID NAME`` and sent SIGTERM, then SIGKILL after 5 s. One ``grep`` reads every
#: environment this user may read; no other user's process is ever signalled.
_ESCAPED = (
    "esc=; for f in $(grep -lzxF " + f'"{MARK}=$pid" /proc/[0-9]*/environ 2>/dev/null); do '
    'p=${f#/proc/}; p=${p%/environ}; read -r s 2>/dev/null <"/proc/$p/stat" || continue; '
    "c=${s#*(}; c=${c%)*}; "
    'kill -TERM "$p" 2>/dev/null && { echo "escaped $p $c"; esc="$esc $p"; }; '
    'done; if [ -n "$esc" ]; then for i in $(seq 50); do left=; '
    'for p in $esc; do kill -0 "$p" 2>/dev/null && left=1; done; [ -n "$left" ] || break; '
    'sleep 0.1; done; for p in $esc; do kill -KILL "$p" 2>/dev/null; done; fi; '
)


def stop_command(node: NodeSpec, grace_s: float) -> list[str]:
    """argv that stops the node's engine: SIGTERM to its process group, SIGKILL after
    ``grace_s``, and confirms it is gone. Prints ``stopped`` or ``killed``; ``exited AGE``
    (or ``exited``) where the engine the pid file names had already exited, AGE seconds ago
    (``cluster.teardown`` says whether with its head); ``absent`` where no engine of ours was
    there (no workdir or pid file, or a pid another process took over). Once the group is
    gone, a process of that start that escaped it is stopped too, each said on a line of its
    own before the outcome (``_ESCAPED``)."""
    wd = shlex.quote(node.workdir)
    ticks = max(1, int(grace_s * 10))
    body = (
        f"cd {wd} 2>/dev/null || {{ echo absent; exit 0; }}; "
        f"[ -s {PIDFILE} ] || {{ echo absent; exit 0; }}; "
        + _LIVE
        + _READ_PID
        + f'case "$pid" in ""|*[!0-9]*) rm -f {PIDFILE}; echo absent; exit 0;; esac; '
        # a pid another process took over is no engine of ours: never signalled
        f"ours || {{ rm -f {PIDFILE}; echo absent; exit 0; }}; "
        # ours, and gone before this stop: it exited (with its head, or on its own)
        f"live || {{ rm -f {PIDFILE}; {_ESCAPED}{_EXITED}exit 0; }}; "
        # ours from here on (``STOPPING``): an engine that dies of it was not killed from outside
        f'echo "$pid" >{STOPPING}; '
        # a stopped engine (SIGSTOP) is continued to act on its SIGTERM: a graceful stop
        'kill -TERM -- "-$pid" 2>/dev/null; kill -CONT -- "-$pid" 2>/dev/null; '
        f"for i in $(seq {ticks}); do "
        f"live || {{ rm -f {PIDFILE}; {_ESCAPED}echo stopped; exit 0; }}; sleep 0.1; done; "
        'kill -KILL -- "-$pid" 2>/dev/null; '
        "for i in $(seq 50); do "
        f"live || {{ rm -f {PIDFILE}; {_ESCAPED}echo killed; exit 0; }}; sleep 0.1; done; "
        "echo alive; exit 1"
    )
    return ["bash", "-c", body]


def stop_started_command(node: NodeSpec, pid: int, born: str, grace_s: float) -> list[str]:
    """argv that stops the engine one start (``start_command``) started, whatever the pid file
    says now (another holder's start may have written it): the process group ``pid`` is
    signalled only while it is that engine's, its leader gone or started at ``born``
    (``ours``), never a process that took the pid over. The pid file and the stop's mark
    (``STOPPING``) are touched only where they still name ``pid``. Prints ``stopped`` or
    ``killed``, ``gone`` where that engine was gone before (or its pid another's now)."""
    if pid <= 0 or (born != "" and not born.isdigit()):
        raise ValueError(f"not an engine's start: pid {pid!r}, start time {born!r}")
    pidfile = shlex.quote(f"{node.workdir}/{PIDFILE}")
    stopping = shlex.quote(f"{node.workdir}/{STOPPING}")
    ticks = max(1, int(grace_s * 10))
    named = f'[ "$(read -r p _ <{pidfile} 2>/dev/null && echo "$p")" = "$pid" ]'
    body = (
        f"pid={pid}; born={born}; "
        'ours() { [ -n "$born" ] || return 0; '
        + _START_TIME
        + '[ -z "$st" ] || [ "$st" = "$born" ]; }; '
        + _LIVE
        + "live && ours || { echo gone; exit 0; }; "
        f'{named} && echo "$pid" >{stopping}; '
        'kill -TERM -- "-$pid" 2>/dev/null; kill -CONT -- "-$pid" 2>/dev/null; '
        f"how=; for i in $(seq {ticks}); do "
        "live || { how=stopped; break; }; sleep 0.1; done; "
        'if [ -z "$how" ]; then kill -KILL -- "-$pid" 2>/dev/null; '
        "for i in $(seq 50); do "
        "live || { how=killed; break; }; sleep 0.1; done; fi; "
        '[ -n "$how" ] || { echo alive; exit 1; }; '
        f"{named} && rm -f {pidfile}; "
        'echo "$how"'
    )
    return ["bash", "-c", body]


def stopped_command(node: NodeSpec) -> list[str]:
    """argv that prints ``PID STATE NAME`` of the first process of the node's engine group
    found stopped (state ``T``: SIGSTOP, a suspended job; ``t``: held by a debugger), nothing
    when none is or there is no engine; exit 0 either way. Read through ``/proc`` with shell
    builtins only: one fork, however many processes the node runs."""
    wd = shlex.quote(node.workdir)
    body = (
        f"cd {wd} 2>/dev/null || exit 0; "
        + _READ_PID
        + 'case "$pid" in ""|*[!0-9]*) exit 0;; esac; '
        "ours || exit 0; "
        "for f in /proc/[0-9]*/stat; do "
        'read -r s 2>/dev/null <"$f" || continue; '
        # the name is between the first "(" and the last ")"; after it: state, ppid, pgrp
        "c=${s#*(}; c=${c%)*}; r=${s##*) }; set -- $r; "
        '[ "${3:-}" = "$pid" ] || continue; '
        'case "$1" in T|t) p=${f#/proc/}; echo "${p%/stat} $1 $c"; exit 0;; esac; '
        "done; exit 0"
    )
    return ["bash", "-c", body]


def alive_command(node: NodeSpec) -> list[str]:
    """argv that exits 0 iff the node's engine process group is alive."""
    wd = shlex.quote(node.workdir)
    body = (
        f"cd {wd} 2>/dev/null || exit 1; "
        + _READ_PID
        + 'case "$pid" in ""|*[!0-9]*) exit 1;; esac; '
        "ours || exit 1; "
        + _LIVE  # a dead engine not yet reaped by init is a zombie: dead, whatever kill -0 says
        + "live"
    )
    return ["bash", "-c", body]


def journaled(node: NodeSpec, argv: Sequence[str], event: str) -> list[str]:
    """argv that runs ``argv`` on ``node``, prints what it printed, exits with its status, and
    appends one line to the node's journal (``EVENTS``) stamped by the node's clock."""
    journal = shlex.quote(f"{node.workdir}/{EVENTS}")
    body = (
        f"out=$({shlex.join(argv)}); rc=$?; "
        f'printf "%s %s rank=%s rc=%s %s\\n" "$(date +%s.%N)" {shlex.quote(event)} '
        f'{node.rank} "$rc" "$(printf "%s" "$out" | tail -n 1)" >>{journal} 2>/dev/null; '
        'printf "%s\\n" "$out"; exit "$rc"'
    )
    return ["bash", "-c", body]


def memory_command(window_s: float, tolerance_mib: float, timeout_s: float) -> list[str]:
    """argv that samples ``MemAvailable`` every ``window_s`` until two samples differ by at most
    ``tolerance_mib``; prints ``settled KIB`` (exit 0) or ``unsettled KIB`` (exit 3)."""
    samples = max(2, math.ceil(timeout_s / window_s) + 1)
    tolerance_kib = int(tolerance_mib * 1024)
    body = (
        "prev=; "
        f"for i in $(seq {samples}); do "
        "cur=$(awk '/^MemAvailable:/{print $2}' /proc/meminfo); "
        'if [ -n "$prev" ]; then d=$((cur - prev)); [ "$d" -lt 0 ] && d=$((-d)); '
        f'if [ "$d" -le {tolerance_kib} ]; then echo "settled $cur"; exit 0; fi; fi; '
        f'prev=$cur; sleep {window_s:.3f}; done; echo "unsettled $cur"; exit 3'
    )
    return ["bash", "-c", body]
