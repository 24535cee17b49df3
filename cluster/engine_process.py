"""What a node's engine process was found doing, read on the node: stopped, or dead of a signal
that orchestrate did not send. Either is the node's doing, never the config's: no config stops
its own engine (SIGSTOP, a suspended host, a debugger holding it), and no config sends its
engine the SIGTERM of a person's ``kill``, a service manager or a host shutting down.

``cluster.blame`` asks these when a boot or a cell fails; ``cluster.launcher`` writes what they
read (the pid file, the wrapper's exit status, the mark of our own stop).

An engine in a container (``docker run``, in the foreground or ``-d``) runs outside the
launcher's process group: a ``docker pause``, or a signal sent to the container's own process,
leaves the group as it was. Where the launcher (or the stop hook) names the container, the
container runtime is asked too, over the node's same transport (``docker inspect``; for a
container that exited with a code of its own, ``docker events``: whether the runtime sent it
a signal, a ``docker stop`` of an engine that takes SIGTERM as a clean stop and exits 0).
"""

from __future__ import annotations

import re
import shlex
import signal
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import PurePosixPath

from cluster.errors import NodeError
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import (
    EXIT,
    PIDFILE,
    STOPPING,
    LauncherSpec,
    fill,
    placeholders,
    stopped_command,
)
from cluster.transport import Transport
from knobs.errors import ProfileError
from knobs.spec import clipped

#: Signals an engine dies of only when someone sends them: a person (Ctrl-C, ``kill``), a
#: service manager, a host shutting down. SIGKILL is not among them: the kernel's OOM killer
#: sends it too, for the config's memory.
OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})

_STOPPED = re.compile(r"^(\d+) ([Tt]) (.*)$")
_STATES = {"T": "stopped by a signal", "t": "held by a debugger"}


def stopped(transport: Transport, node: NodeSpec, container: str | None = None) -> str | None:
    """The first process of ``node``'s engine group found stopped, in words (``pid 812
    (python3) stopped by a signal``), else, for an engine in ``container``, the container
    paused or a process of it stopped (``container_stopped``); None when none is, when there
    is no engine, or when the node cannot be asked."""
    try:
        result = transport.run(stopped_command(node), timeout=30)
    except NodeError:
        return None
    found = _STOPPED.match(_last_line(result.stdout))
    if result.returncode == 0 and found is not None:
        return _in_words(*found.groups())
    return None if container is None else container_stopped(transport, container)


def killed_by(
    transport: Transport, node: NodeSpec, container: str | None = None
) -> signal.Signals | None:
    """The signal ``node``'s engine died of when it is one of ``OUTSIDE_SIGNALS`` and not ours:
    its wrapper's exit status (``EXIT``) is 128 + the signal, for the engine the pid file names,
    and our own stop did not mark it (``STOPPING``); for an engine in ``container``, the
    container's exit code says so (``container_killed_by``). None otherwise: an engine of an
    older release (no status file), a crash, an exit of its own, a SIGKILL (the OOM killer's
    as much as a person's), a node that cannot be read."""
    try:
        pidfile, status, ours = (
            transport.read_text(f"{node.workdir}/{name}", max_bytes=256)
            for name in (PIDFILE, EXIT, STOPPING)
        )
    except NodeError:
        return None
    sig = outside_signal(pidfile, status, ours)
    if sig is not None or container is None:
        return sig
    return container_killed_by(transport, node, container, pidfile, ours)


def outside_signal(pidfile: str, status: str, ours: str) -> signal.Signals | None:
    """``killed_by`` on the three files' text (see there)."""
    pid = pidfile.split()[:1]
    fields = status.split()
    if not pid or len(fields) != 2 or fields[0] != pid[0] or not fields[1].isdigit():
        return None
    if ours.split()[:1] == pid:
        return None
    return _signalled(int(fields[1]))


def _signalled(code: int) -> signal.Signals | None:
    """The one of ``OUTSIDE_SIGNALS`` an exit status of 128 + N says the process died of."""
    if code <= 128:
        return None
    try:
        sig = signal.Signals(code - 128)
    except ValueError:
        return None
    return sig if sig in OUTSIDE_SIGNALS else None


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _in_words(pid: str, state: str, name: str) -> str:
    name = clipped("".join(ch for ch in name if ch.isprintable()), 40)
    return f"pid {pid} ({name}) {_STATES[state]}"


# ---- engines in containers ------------------------------------------------------------------

#: ``docker run`` options that take no value (the rest take one, unless ``--opt=value``).
#: ``orchestrator.adopt`` reads a launcher's ``docker run`` with them too.
DOCKER_SWITCHES = frozenset(
    {"-d", "--detach", "--rm", "-i", "--interactive", "-t", "--tty", "--privileged", "--init"}
)
#: A container's name as Docker allows one (and nothing a shell reads otherwise).
CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
#: ``docker stop`` and ``docker kill`` options that take a value.
_STOP_VALUES = frozenset({"-t", "--time", "--timeout", "-s", "--signal"})
#: What ``docker inspect`` prints of a container: one line.
_INSPECT = (
    "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}} {{.State.OOMKilled}} {{.State.StartedAt}}"
)
_INSPECTED = re.compile(r"^([a-z]+) (\d+) (-?\d+) (true|false) (\S+)$")
_STARTED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)$")
#: A container that started more than this before the engine's pid file was written is not
#: this boot's (one left by an earlier boot, whose name made this boot's ``docker run`` fail).
_SAME_BOOT_S = 2.0


def container_of(
    launcher: LauncherSpec,
    stop_hook: Sequence[str] | None,
    cluster: ClusterSpec,
    node: NodeSpec,
    runtime: Mapping[str, str],
) -> str | None:
    """The container ``node``'s engine runs in: the ``--name`` of its launcher's ``docker
    run`` (in its argv, or in a ``bash -c`` script of it), else the container the stop hook
    stops (``docker stop … NAME``), placeholders filled. None when neither names one, or a
    name Docker would refuse."""
    values = placeholders(cluster, node, runtime)
    role = launcher.head_argv if node.rank == 0 else launcher.worker_argv
    try:
        argv = [fill(t, values, node.name) for t in (*launcher.argv, *role)]
        hook = [fill(t, values, node.name) for t in stop_hook or ()]
    except ProfileError:
        return None
    names = [_run_name(words) for words in _commands(argv)]
    names += [_stop_name(words) for words in _commands(hook)]
    name = next((n for n in names if n is not None), None)
    return name if name is not None and CONTAINER_NAME.match(name) else None


def _commands(argv: Sequence[str]) -> Iterator[list[str]]:
    """``argv``, then the words of each of its tokens that is a script (``bash -c '…'``)."""
    yield list(argv)
    for token in argv:
        if " " in token:
            try:
                yield shlex.split(token)
            except ValueError:
                continue


def _after_docker(words: list[str], verbs: tuple[str, ...]) -> Iterator[list[str]]:
    """The words after each ``docker [container] VERB`` of ``words`` (one of ``verbs``)."""
    for i, word in enumerate(words):
        if PurePosixPath(word).name != "docker":
            continue
        rest = words[i + 1 :]
        rest = rest[1:] if rest[:1] == ["container"] else rest
        if rest[:1] and rest[0] in verbs:
            yield rest[1:]


def _run_name(words: list[str]) -> str | None:
    """The ``--name`` of a ``docker run`` of ``words``, read up to its image."""
    for rest in _after_docker(words, ("run",)):
        i = 0
        while i < len(rest) and rest[i].startswith("-"):
            word = rest[i]
            if word == "--name" and i + 1 < len(rest):
                return rest[i + 1]
            if word.startswith("--name="):
                return word.split("=", 1)[1]
            switch = word in DOCKER_SWITCHES or "=" in word or re.fullmatch(r"-[dit]+", word)
            i += 1 if switch else 2
    return None


def _stop_name(words: list[str]) -> str | None:
    """The first container a ``docker stop`` or ``docker kill`` of ``words`` names."""
    for rest in _after_docker(words, ("stop", "kill")):
        i = 0
        while i < len(rest) and rest[i].startswith("-"):
            i += 2 if rest[i] in _STOP_VALUES else 1
        if i < len(rest):
            return rest[i]
    return None


def _inspect(container: str) -> str:
    """Shell that prints ``_INSPECT`` of ``container`` (nothing where Docker cannot say)."""
    return (
        f"docker inspect --type container --format {shlex.quote(_INSPECT)} "
        f"{shlex.quote(container)} 2>/dev/null"
    )


#: A container state in which its engine may still hold the GPUs and serve.
_UP_STATES = "running|paused|restarting"


def container_stop_command(container: str, grace_s: float) -> list[str]:
    """argv that makes sure ``container`` is not up once the launcher's own stop is done:
    prints ``gone`` where the runtime says it is not running (exited, removed, never made,
    or no runtime that answers), else stops it (``docker stop``: SIGTERM, SIGKILL after
    ``grace_s``) and prints ``stopped`` once the runtime says it is down, or ``up STATE``
    (exit 1) where it is still up. An engine started with ``docker run -d``, or a ``docker
    run`` client that died of the launcher's SIGTERM without passing it on, leaves its
    container serving after its launcher's process group is gone."""
    name = shlex.quote(container)
    state = f"docker inspect --type container --format '{{{{.State.Status}}}}' {name} 2>/dev/null"
    body = (
        f's=$({state}) || {{ echo gone; exit 0; }}; case "$s" in {_UP_STATES}) ;; '
        "*) echo gone; exit 0;; esac; "
        f"said=$(docker stop -t {max(1, int(grace_s))} {name} 2>&1 >/dev/null); "
        f's=$({state}) || {{ echo stopped; exit 0; }}; case "$s" in {_UP_STATES}) '
        'echo "up $s: $(printf "%s" "$said" | tail -n 1)"; exit 1;; esac; echo stopped'
    )
    return ["bash", "-c", body]


def container_stopped(transport: Transport, container: str) -> str | None:
    """``container`` paused (``docker pause``: its processes frozen, none in state T), or the
    first of its processes found stopped (a SIGSTOP sent to the container's own process, which
    Docker still calls running), in words; None otherwise, or where its runtime cannot say.
    The container's processes are its init's session (the runtime starts it in one)."""
    if not CONTAINER_NAME.match(container):
        return None
    body = (
        f"s=$({_inspect(container)}) || exit 0; "
        'printf "%s\n" "$s"; set -- $s; [ "${1:-}" = running ] || exit 0; sid=${2:-0}; '
        'case "$sid" in ""|0|*[!0-9]*) exit 0;; esac; '
        "for f in /proc/[0-9]*/stat; do "
        'read -r s 2>/dev/null <"$f" || continue; '
        # the name is between the first "(" and the last ")"; after it: state, ppid, pgrp, sid
        "c=${s#*(}; c=${c%)*}; r=${s##*) }; set -- $r; "
        '[ "${4:-}" = "$sid" ] || continue; '
        'case "$1" in T|t) p=${f#/proc/}; echo "${p%/stat} $1 $c"; exit 0;; esac; '
        "done; exit 0"
    )
    said = _said(transport, body)
    if said is None:
        return None
    lines = said.strip().splitlines()
    inspected = _INSPECTED.match(lines[0]) if lines else None
    if inspected is None:
        return None
    if inspected.group(1) == "paused":
        return f"container {container} paused"
    found = _STOPPED.match(lines[-1]) if len(lines) > 1 else None
    return None if found is None else f"{_in_words(*found.groups())} in container {container}"


def container_killed_by(
    transport: Transport, node: NodeSpec, container: str, pidfile: str, ours: str
) -> signal.Signals | None:
    """The signal of ``OUTSIDE_SIGNALS`` that ``container`` exited of (Docker's exit code is
    128 + N), or that the runtime sent it before it exited with a code of its own (a ``docker
    stop`` of an engine that takes SIGTERM as a clean stop and exits 0: ``runtime_sent``),
    when the container is this boot's (it started as the engine the pid file names did, not
    before: ``_SAME_BOOT_S``) and our own stop did not mark that engine (``STOPPING``). None
    otherwise: the OOM killer's kill (``OOMKilled``: the config's, as for an engine outside
    a container), a SIGKILL, an exit of its own with no such signal sent, a container still
    running or gone (``--rm``), a runtime that cannot say."""
    pid = pidfile.split()[:1]
    if not pid or ours.split()[:1] == pid or not CONTAINER_NAME.match(container):
        return None
    body = (
        f"cd {shlex.quote(node.workdir)} 2>/dev/null || exit 0; "
        f"date -r {PIDFILE} +%s.%N 2>/dev/null || echo -; {_inspect(container)}; exit 0"
    )
    said = _said(transport, body)
    if said is None:
        return None
    lines = said.strip().splitlines()
    inspected = _INSPECTED.match(lines[1]) if len(lines) > 1 else None
    if inspected is None or not re.fullmatch(r"\d+(\.\d+)?", lines[0]):
        return None
    status, _pid, code, oom, started = inspected.groups()
    begun = _unix(started)
    if status not in ("exited", "dead") or oom == "true" or begun is None:
        return None
    if begun < float(lines[0]) - _SAME_BOOT_S:
        return None
    return _signalled(int(code)) or runtime_sent(transport, container, started)


def runtime_sent(transport: Transport, container: str, since: str) -> signal.Signals | None:
    """The first of ``OUTSIDE_SIGNALS`` the container runtime sent ``container`` since
    ``since`` (its start, as ``docker inspect`` gives it), by the runtime's own record: each
    signal of a ``docker stop`` or ``docker kill`` is a ``kill`` event naming it (``docker
    events``, up to the node's now). None where it sent none, or cannot say."""
    if not CONTAINER_NAME.match(container) or _STARTED.match(since) is None:
        return None
    body = (
        f'docker events --since {shlex.quote(since)} --until "$(date +%s)" '
        f"--filter {shlex.quote('container=' + container)} --filter event=kill "
        f"--format {shlex.quote('{{.Actor.Attributes.signal}}')} 2>/dev/null; exit 0"
    )
    said = _said(transport, body)
    if said is None:
        return None
    for word in said.split():
        sig = _signal_named(word)
        if sig in OUTSIDE_SIGNALS:
            return sig
    return None


def _signal_named(word: str) -> signal.Signals | None:
    """A signal as Docker's event names it: its number (``15``), or its name (``SIGTERM``,
    ``TERM``)."""
    try:
        if word.isdigit():
            return signal.Signals(int(word))
        return signal.Signals[word if word.startswith("SIG") else f"SIG{word}"]
    except (KeyError, ValueError):
        return None


def _unix(stamp: str) -> float | None:
    """Docker's RFC 3339 time (nanoseconds, ``Z``) in seconds since the epoch."""
    found = _STARTED.match(stamp)
    if found is None:
        return None
    base, fraction, zone = found.groups()
    text = base + (f".{fraction[:6]}" if fraction else "") + ("+00:00" if zone == "Z" else zone)
    return datetime.fromisoformat(text).timestamp()


def _said(transport: Transport, body: str) -> str | None:
    """What ``body`` (a shell script asking the node's container runtime) printed on the
    node; None where the node could not be asked (the caller then judges as before)."""
    try:
        return transport.run(["bash", "-c", body], timeout=30).stdout
    except NodeError:
        return None
