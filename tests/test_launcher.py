"""Launcher rendering and the detached start/stop commands, run by real bash."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.inventory import ClusterSpec, NodeSpec
from cluster.launcher import LauncherSpec, alive_command, render_node, start_command, stop_command
from cluster.transport import LocalTransport
from knobs import KnobSpace, catalog
from knobs.errors import ProfileError

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
    assert started.returncode == 0 and started.stdout.strip().isdigit()
    pid = int(started.stdout)
    assert transport.run(alive_command(node)).returncode == 0
    assert os.getpgid(pid) == pid  # its own process group, so nothing else is signalled
    stopped = transport.run(stop_command(node, grace_s=0.3))
    assert stopped.stdout.strip() == "killed", stopped
    assert transport.run(alive_command(node)).returncode != 0
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
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
    pid = int(started.stdout)
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
