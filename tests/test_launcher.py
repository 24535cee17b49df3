"""Launcher rendering and the detached start/stop commands, run by real bash."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cluster.engine_process import killed_by
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import (
    LauncherSpec,
    alive_command,
    marked,
    render_node,
    start_command,
    started,
    stop_command,
    stop_started_command,
)
from cluster.transport import LocalTransport
from knobs import KnobSpace, catalog
from knobs.errors import ProfileError
from tests.fixtures.processes import group_living

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))
ECHO_ARGV = [
    sys.executable,
    "-c",
    "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ.get('TAG')]))",
]


def _cluster(tmp_path: Path, nodes: int = 2) -> ClusterSpec:
    return ClusterSpec(
        name="t",
        nodes=tuple(
            NodeSpec(rank=r, host="127.0.0.1", workdir=str(tmp_path / f"n{r}"))
            for r in range(nodes)
        ),
        port=8123,
        master_port=29999,
    )


def test_rendered_script_passes_every_token_through_bash_unchanged(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path)
    spec = LauncherSpec(
        argv=(
            *ECHO_ARGV,
            "serve",
            "model with spaces",
            "--node-rank",
            "{rank}",
            "--master-addr",
            "{head_host}",
            "it's $(id) `id` ; reboot",
        ),
        head_argv=("--port", "{port}"),
        worker_argv=("--headless",),
        env={"TAG": "a'b\"c $HOME"},
        json_flags={"--speculative-config": {"method": "dflash"}},
    )
    config = SPACE.config({"num_speculative_tokens": 5}, partial=True)
    for node in cluster.nodes:
        rendered = render_node(spec, SPACE, config, cluster, node, {})
        os.makedirs(node.workdir, exist_ok=True)
        script = Path(node.workdir) / "launcher.sh"
        script.write_text(rendered.script)
        out = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
        argv, tag = json.loads(out.stdout)
        assert argv == list(rendered.argv[len(ECHO_ARGV) :])
        assert tag == "a'b\"c $HOME"
        assert "it's $(id) `id` ; reboot" in argv
        assert argv[argv.index("--node-rank") + 1] == str(node.rank)
        assert ("--headless" in argv) == (node.rank != 0)
        assert ("--port" in argv) == (node.rank == 0)
        spec_json = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec_json == {
            "method": "dflash",
            "num_speculative_tokens": 5,
            "model": "/models/dflash2-r64",
        }


def test_unknown_placeholder_is_a_profile_error(tmp_path: Path) -> None:
    cluster = _cluster(tmp_path, 1)
    spec = LauncherSpec(argv=("vllm", "{nope}"))
    with pytest.raises(ProfileError, match=r"unknown placeholder \{nope\}; known: .*rank"):
        render_node(spec, SPACE, SPACE.default_config(), cluster, cluster.head, {})


def test_control_characters_never_reach_a_launcher() -> None:
    with pytest.raises(ValueError, match="control characters"):
        LauncherSpec(argv=("vllm", "serve\nreboot"))
    with pytest.raises(ValueError, match="not an environment variable name"):
        LauncherSpec(argv=("vllm",), env={"A;B": "x"})


def test_start_detaches_and_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    transport = LocalTransport(node)
    # the "engine" ignores SIGTERM and has a child: only SIGKILL of the group ends both
    transport.put_text(
        f"{node.workdir}/launcher.sh",
        "trap '' TERM\nsleep 300 &\necho started\nwait\n",
        mode=0o755,
    )
    started = transport.run(start_command(node))
    assert started.returncode == 0 and started.stdout.split()[0].isdigit()
    pid = int(started.stdout.split()[0])
    assert transport.run(alive_command(node)).returncode == 0
    assert os.getpgid(pid) == pid  # its own process group, so nothing else is signalled
    stopped = transport.run(stop_command(node, grace_s=0.3))
    assert stopped.stdout.strip() == "killed", stopped
    assert transport.run(alive_command(node)).returncode != 0
    assert group_living(pid) == []
    again = transport.run(stop_command(node, grace_s=0.3))
    assert again.stdout.strip() == "absent"


def test_stop_is_graceful_when_the_engine_honours_sigterm(tmp_path: Path) -> None:
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    transport = LocalTransport(node)
    transport.put_text(f"{node.workdir}/launcher.sh", "exec sleep 300\n", mode=0o755)
    assert transport.run(start_command(node)).returncode == 0
    assert transport.run(stop_command(node, grace_s=5)).stdout.strip() == "stopped"


def _living(pid: int) -> bool:
    """Whether process ``pid`` runs (exists and is no zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_pid_another_process_took_over_is_never_signalled(tmp_path: Path) -> None:
    """The pid file outlives its engine (a node's reboot, a crash that left it): a process
    that took the pid over — another user's, another cluster's — is no engine of ours. Its
    start time is not the one recorded at the start, so the stop leaves it alone and calls
    the node's engine absent, and the liveness check says dead. A pid file of an older
    orchestrate (the pid alone) is trusted as before."""
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    transport = LocalTransport(node)
    transport.put_text(f"{node.workdir}/launcher.sh", "exec sleep 300\n", mode=0o755)
    started = transport.run(start_command(node))
    pid = int(started.stdout.split()[0])
    pidfile = Path(node.workdir) / "engine.pid"
    recorded_pid, born = pidfile.read_text().split()
    assert int(recorded_pid) == pid and born.isdigit()
    assert transport.run(stop_command(node, grace_s=5)).stdout.strip() == "stopped"
    # another process, in a session of its own as an engine is, holds the pid file's pid now
    spawn = "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"
    other = int(subprocess.run(["bash", "-c", spawn], capture_output=True, text=True).stdout)
    try:
        pidfile.write_text(f"{other} {int(born) - 1}\n")
        assert transport.run(alive_command(node)).returncode != 0
        assert transport.run(stop_command(node, grace_s=5)).stdout.strip() == "absent"
        assert _living(other), "another process's group was signalled"
        assert not pidfile.exists()
        pidfile.write_text(f"{other}\n")  # an older orchestrate's pid file: trusted
        assert transport.run(alive_command(node)).returncode == 0
        assert transport.run(stop_command(node, grace_s=5)).stdout.strip() in ("stopped", "killed")
        assert not _living(other)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(other, signal.SIGKILL)


def test_a_start_is_stopped_by_what_it_started_never_by_the_pid_file_of_now(
    tmp_path: Path,
) -> None:
    """A round that lost a node's claim stops the engine its own start started (its process
    group and start time, as the start printed them), whatever the pid file says now: the
    engine a new holder started in the same workdir since lives on, its pid file and the
    stop's mark untouched; a pid another process took over is never signalled."""
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    workdir = Path(node.workdir)
    transport = LocalTransport(node)
    transport.put_text(f"{node.workdir}/launcher.sh", "exec sleep 300\n", mode=0o755)
    ours = started(transport.run(start_command(node)).stdout)
    assert ours is not None and ours[1].isdigit(), ours
    theirs = started(transport.run(start_command(node)).stdout)  # the new holder's start
    assert theirs is not None and theirs != ours
    try:
        stop = transport.run(stop_started_command(node, *ours, grace_s=5))
        assert stop.stdout.strip() == "stopped", stop
        assert group_living(ours[0]) == []
        assert _living(theirs[0]), "the new holder's engine was signalled"
        assert (workdir / "engine.pid").read_text().split()[0] == str(theirs[0])
        assert not (workdir / "engine.stopping").exists()
        again = transport.run(stop_started_command(node, *ours, grace_s=5))
        assert again.stdout.strip() == "gone"
        # the new holder's pid with another start time: a process that took a pid over
        reused = (theirs[0], str(int(theirs[1]) - 1))
        assert transport.run(stop_started_command(node, *reused, grace_s=5)).stdout.strip() == (
            "gone"
        )
        assert _living(theirs[0])
        # its own start's record stops it, as ours: pid file and mark its own
        assert transport.run(stop_started_command(node, *theirs, grace_s=5)).stdout.strip() == (
            "stopped"
        )
        assert not (workdir / "engine.pid").exists()
        assert (workdir / "engine.stopping").read_text().strip() == str(theirs[0])
    finally:
        for pid in (ours[0], theirs[0]):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    with pytest.raises(ValueError):
        stop_started_command(node, 12, "1; reboot", grace_s=5)


def test_an_engine_that_escaped_its_process_group_is_stopped_with_it_and_said(
    tmp_path: Path,
) -> None:
    """A native engine that daemonizes (a child in a session of its own: setsid, a double
    fork) runs outside the launcher's process group: the stop's SIGTERM and SIGKILL of the
    group never reach it, and the stop said ``stopped`` while it served on. Every process the
    launcher starts carries the mark of its start (``ORCHESTRATE_ENGINE``, the group's pid)
    in its environment; the stop finds the marked processes left once the group is gone,
    stops them and says each, its outcome still the last line. A process of the same user
    that bears no mark (another's) is never signalled."""
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    transport = LocalTransport(node)
    escaped = tmp_path / "escaped.pid"
    transport.put_text(
        f"{node.workdir}/launcher.sh",
        f"setsid bash -c 'echo $$ >{escaped}; exec sleep 300' </dev/null >/dev/null 2>&1 &\n"
        "exec sleep 300\n",
        mode=0o755,
    )
    spawn = "setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $!"
    other = int(subprocess.run(["bash", "-c", spawn], capture_output=True, text=True).stdout)
    group = started(transport.run(start_command(node)).stdout)
    assert group is not None
    try:
        wait_for = time.monotonic() + 20
        while not (escaped.exists() and escaped.read_text().strip()):
            assert time.monotonic() < wait_for, "the engine never daemonized"
            time.sleep(0.02)
        daemon = int(escaped.read_text())
        assert os.getsid(daemon) != os.getsid(group[0]), "it escaped the launcher's session"
        stop = transport.run(stop_command(node, grace_s=5))
        lines = stop.stdout.strip().splitlines()
        assert lines[-1] == "stopped", stop
        assert f"escaped {daemon} sleep" in lines, stop
        assert not _living(daemon), "the engine that escaped its group still runs"
        assert _living(other), "a process without the mark was signalled"
    finally:
        for pid in (other, *([int(escaped.read_text())] if escaped.exists() else [])):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(pid, signal.SIGKILL)


#: Run by a process that adopts its orphans and never reaps them (PR_SET_CHILD_SUBREAPER), as
#: a container's PID 1 without ``--init`` does: an engine's stop there, then a start's stop.
UNREAPED = """
import ctypes, json, os, sys, time
from cluster.inventory import NodeSpec
from cluster.launcher import (
    alive_command, start_command, started, stop_command, stop_started_command,
)
from cluster.transport import LocalTransport
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
node = NodeSpec(rank=0, host="127.0.0.1", workdir=sys.argv[1])
transport = LocalTransport(node)
transport.put_text(f"{node.workdir}/launcher.sh", "exec sleep 300\\n", mode=0o755)
said = []
for stop in (lambda g: stop_command(node, 1.0), lambda g: stop_started_command(node, *g, 1.0)):
    group = started(transport.run(start_command(node)).stdout)
    assert group is not None
    t = time.monotonic()
    done = transport.run(stop(group))
    said.append([done.stdout.strip(), done.returncode, round(time.monotonic() - t, 2)])
# its leader (the wrapper) killed and left a zombie, its engine running on: alive until stopped
group = started(transport.run(start_command(node)).stdout)
assert group is not None
os.kill(group[0], 9)
while open(f"/proc/{group[0]}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
    time.sleep(0.01)
said.append([transport.run(alive_command(node)).returncode])
said.append([transport.run(stop_command(node, 1.0)).stdout.strip()])
said.append([transport.run(alive_command(node)).returncode])
print(json.dumps(said))
"""


def test_an_engine_left_a_zombie_by_an_init_that_never_reaps_is_stopped_not_called_alive(
    tmp_path: Path,
) -> None:
    """An engine whose starter is gone is adopted by the node's init, which reaps it when it
    exits. Where init reaps late (a sandbox's, a second later), or never (a container whose
    PID 1 is no init), the stopped engine's process group lives on as zombies, and ``kill
    -0`` of the group succeeds: each stop waited out its grace and the SIGKILL's 5 s, then said
    ``alive``, a node that could not be stopped. A group of zombies is gone; a group whose
    leader alone is one (the wrapper killed) is alive while its engine runs."""
    done = subprocess.run(
        [sys.executable, "-c", UNREAPED, str(tmp_path / "node")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (by_file, by_start, leaderless, stop, after) = json.loads(done.stdout)
    assert by_file[:2] == ["stopped", 0], by_file
    assert by_start[:2] == ["stopped", 0], by_start
    # and a group whose leader alone is a zombie is alive while its engine runs
    assert (leaderless, stop, after) == ([0], ["stopped"], [1])


def _engine_child(workdir: Path) -> int:
    """The engine of a node started by ``start_command``: its wrapper's one child, once the
    wrapper has started it."""
    group = int((workdir / "engine.pid").read_text().split()[0])
    children = Path(f"/proc/{group}/task/{group}/children")
    deadline = time.monotonic() + 20
    while not children.read_text().split():
        assert time.monotonic() < deadline, "the wrapper never started its engine"
        time.sleep(0.02)
    (child,) = children.read_text().split()
    return int(child)


def _until_gone(transport: LocalTransport, node: NodeSpec) -> None:
    """Wait until the node's engine group is dead (its wrapper has recorded the status)."""
    deadline = time.monotonic() + 20
    while transport.run(alive_command(node)).returncode == 0:
        if time.monotonic() > deadline:
            raise AssertionError("the engine group never went")
        time.sleep(0.02)


def test_a_kill_from_outside_is_recorded_and_our_own_stops_never_read_as_one(
    tmp_path: Path,
) -> None:
    """The launcher's wrapper records the engine's exit status beside the pid file. A SIGTERM
    a person sends the engine reads as a kill from outside; SIGKILL (the OOM killer's too) and
    an exit of its own do not. Our own stops never do: ``stop_command`` signals the whole
    group, wrapper included, and marks the stop; a profile's stop hook (``docker stop``) is
    marked before it runs. An engine an older release started has no status file: nothing is
    read from it, as before."""
    node = NodeSpec(rank=0, host="127.0.0.1", workdir=str(tmp_path / "node"))
    workdir = Path(node.workdir)
    transport = LocalTransport(node)

    def started(script: str) -> int:
        transport.put_text(f"{node.workdir}/launcher.sh", script, mode=0o755)
        assert transport.run(start_command(node)).returncode == 0
        return _engine_child(workdir) if "sleep" in script else 0

    sleeper = f"exec {shlex.quote(sys.executable)} -c 'import time; time.sleep(300)'\n"
    os.kill(started(sleeper), signal.SIGTERM)
    _until_gone(transport, node)
    assert killed_by(transport, node) == signal.SIGTERM
    (workdir / "engine.exit").unlink()  # an engine an older release started: no status
    assert killed_by(transport, node) is None

    os.kill(started(sleeper), signal.SIGKILL)
    _until_gone(transport, node)
    assert (workdir / "engine.exit").read_text().split()[1] == "137"
    assert killed_by(transport, node) is None
    started("exit 3\n")
    _until_gone(transport, node)
    assert killed_by(transport, node) is None

    # our stop: the pid file put back as a stop cut short before it removed it would leave it
    started(sleeper)
    pidfile = (workdir / "engine.pid").read_text()
    assert transport.run(stop_command(node, grace_s=5)).stdout.strip() == "stopped"
    (workdir / "engine.pid").write_text(pidfile)
    assert killed_by(transport, node) is None
    # a stop hook that sends the engine SIGTERM itself, as `docker stop` does its container
    engine = started(sleeper)
    hook = marked(node, ["kill", "-TERM", str(engine)])
    assert transport.run(hook).returncode == 0
    _until_gone(transport, node)
    assert (workdir / "engine.exit").read_text().split()[1] == "143"
    assert killed_by(transport, node) is None
