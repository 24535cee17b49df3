"""An engine in a container, paused, stopped or killed from outside, is its node's, never the
config's. The container's process runs outside the launcher's process group, so only the
container runtime can say what became of it: it is asked over the node's own SSH transport.

The runtime is a real fake: an executable ``docker`` first on the PATH of the sshd test host's
user, that runs each "container" as a process of its own session (outside the client's
group, as a real runtime's is) and answers ``inspect`` from a state file per container (its
``--format`` rendered as Docker renders it), and records each signal its ``stop`` sends as
Docker's ``kill`` event, which ``events --since --until`` lists. The launcher is ``docker run
-d`` then ``docker wait``, whose exit status is 0 however the container ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cluster.deploy import Deployer
from cluster.engine_process import container_of
from cluster.errors import DeployError
from knobs.vocabulary import INFRASTRUCTURE
from orchestrator.profile import load_profile
from orchestrator.settings import runtime_placeholders
from orchestrator.testbed import deployer_for
from tests.fixtures.profiles import twin_profile_data, write_profile
from tests.fixtures.sshd import SshCluster
from tests.fixtures.wait import wait_until
from tests.test_init import _init as adopted

NAME = "eng-0"

DOCKER = r"""#!/bin/bash
# a container runtime for tests: one state file per container, "STATUS PID EXITCODE OOM STARTED"
d=@STATE@
echo "$*" >>"$d/calls"
cmd=$1; shift
case "$cmd" in
run)
  name=
  while [ $# -gt 0 ]; do
    case "$1" in
      --name) name=$2; shift 2;;
      --name=*) name=${1#--name=}; shift;;
      -d|--detach|--rm) shift;;
      -*) shift 2;;
      *) break;;
    esac
  done
  shift  # the image
  if [ -e "$d/$name" ]; then
    echo "Conflict. The container name \"/$name\" is already in use" >&2; exit 125
  fi
  started=$(date -u +%Y-%m-%dT%H:%M:%S.%NZ)
  # the container's init: a session of its own, whose child is the container's process; as
  # a real runtime's (dockerd starts it), it has none of the client's environment's marks
  env -u ORCHESTRATE_ENGINE setsid bash -c '
    d=$1; name=$2; started=$3; shift 3
    "$@" </dev/null & echo $! >"$d/$name.pid"
    echo "running $$ 0 false $started" >"$d/$name"
    wait $!; code=$?
    oom=false; [ -e "$d/$name.oom" ] && oom=true
    echo "exited 0 $code $oom $started" >"$d/$name"
  ' shim "$d" "$name" "$started" "$@" &
  while [ ! -s "$d/$name" ]; do sleep 0.02; done
  echo "$name";;
wait)
  while read -r st _ code _ <"$d/$1" && [ "$st" != exited ]; do sleep 0.05; done
  echo "$code";;
pause|unpause)
  read -r st pid code oom started <"$d/$1"
  [ "$cmd" = pause ] && st=paused || st=running
  echo "$st $pid $code $oom $started" >"$d/$1";;
stop)
  [ "$1" = -t ] && { t=$2; shift 2; } || t=10
  read -r st _ <"$d/$1" 2>/dev/null || { echo "No such container: $1" >&2; exit 1; }
  [ "$st" = exited ] && { echo "$1"; exit 0; }
  # as Docker does, each signal the runtime sends is a "kill" event with its number
  echo "$(date +%s.%N) $1 15" >>"$d/events"
  kill -TERM "$(cat "$d/$1.pid")" 2>/dev/null
  for i in $(seq $((t * 20))); do
    read -r st _ <"$d/$1"; [ "$st" = exited ] && break; sleep 0.05
  done
  [ "$st" = exited ] || echo "$(date +%s.%N) $1 9" >>"$d/events"
  kill -KILL "$(cat "$d/$1.pid")" 2>/dev/null
  echo "$1";;
events)
  since=; until=; name=; kind=; f=
  while [ $# -gt 0 ]; do
    case "$1" in
      --since) since=$(date -d "$2" +%s.%N); shift 2;;
      --until) until=$2; shift 2;;
      --filter) case "$2" in container=*) name=${2#container=};; event=*) kind=${2#event=};; esac
        shift 2;;
      --format) f=$2; shift 2;;
      *) echo "fake docker: events takes no $1" >&2; exit 2;;
    esac
  done
  [ -n "$until" ] || { echo "fake docker: events without --until streams forever" >&2; exit 2; }
  [ "$kind" = kill ] && [ "$f" = '{{.Actor.Attributes.signal}}' ] || {
    echo "fake docker: events wants --filter event=kill and the signal's --format" >&2; exit 2; }
  [ -e "$d/events" ] || exit 0
  while read -r at who sig; do
    [ "$who" = "$name" ] || continue
    awk -v a="$at" -v s="${since:-0}" -v u="$until" 'BEGIN { exit !(a >= s && a <= u + 1) }' &&
      echo "$sig"
  done <"$d/events";;
rm)
  rm -f "$d/$1" "$d/$1.pid" "$d/$1.oom"; echo "$1";;
inspect)
  [ "$1" = --type ] && shift 2
  [ "$1" = --format ] || { echo "fake docker: inspect wants --format" >&2; exit 2; }
  f=$2; shift 2
  if ! read -r st pid code oom started <"$d/$1" 2>/dev/null; then
    echo "Error: No such object: $1" >&2; exit 1
  fi
  f=${f//'{{.State.Status}}'/$st}; f=${f//'{{.State.Pid}}'/$pid}
  f=${f//'{{.State.ExitCode}}'/$code}; f=${f//'{{.State.OOMKilled}}'/$oom}
  f=${f//'{{.State.StartedAt}}'/$started}
  case "$f" in *'{{'*) echo "template: unknown field in $f" >&2; exit 1;; esac
  printf '%s\n' "$f";;
*)
  echo "fake docker: no command $cmd" >&2; exit 1;;
esac
"""

SLEEPER = "import time; time.sleep(600)"


@dataclass
class Runtime:
    """The fake runtime on node 0: its state directory and its ``docker``."""

    state: Path
    docker: Path

    def container_pid(self) -> int:
        """The container's process (the engine), once it runs."""
        pidfile = self.state / f"{NAME}.pid"
        wait_until("the container to run", lambda: pidfile.exists() and pidfile.read_text(), 30)
        return int(pidfile.read_text())

    def calls(self) -> list[str]:
        path = self.state / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def kill_left(self) -> None:
        """The container's process, if the test's own teardown left it."""
        pidfile = self.state / f"{NAME}.pid"
        if pidfile.exists() and pidfile.read_text().strip():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)


@pytest.fixture
def runtime(ssh_cluster: SshCluster) -> Iterator[Runtime]:
    host = ssh_cluster.node(0)
    state = host.dir / "containers"
    state.mkdir(exist_ok=True)
    for old in state.iterdir():
        old.unlink()
    docker = host.bin / "docker"
    docker.write_text(DOCKER.replace("@STATE@", str(state)))
    docker.chmod(0o755)
    made = Runtime(state, docker)
    yield made
    made.kill_left()


def profile_data(cluster: SshCluster, *, container: bool) -> dict[str, Any]:
    """One node (node 0 over SSH) whose engine hangs as it loads: in a container started with
    ``docker run -d`` and waited on with ``docker wait`` (``container``), else natively."""
    data = cluster.profile_data()
    data["cluster"]["nodes"] = data["cluster"]["nodes"][:1]
    engine = f"{{python}} -c '{SLEEPER}'"
    if container:
        script = f"docker run -d --name {NAME} vllm/vllm-openai {engine} && exec docker wait {NAME}"
        data["launcher"]["argv"] = ["bash", "-c", script]
        stop = f"docker stop -t 5 {NAME} >/dev/null 2>&1; docker rm {NAME}"
        data["gates"]["stop_hook"] = ["bash", "-c", stop]
    else:
        data["launcher"]["argv"] = ["{python}", "-c", SLEEPER]
    data["launcher"]["head_argv"] = []
    data["launcher"]["worker_argv"] = []
    data["gates"]["stall_s"] = 3.0
    data["gates"].pop("must_log", None)
    return data


def boot(cluster: SshCluster, directory: Path, *, container: bool) -> tuple[Deployer, Any]:
    directory.mkdir()
    prof = load_profile(str(write_profile(directory, profile_data(cluster, container=container))))
    return deployer_for(prof), prof.initial_champion()


def failed_boot(deployer: Deployer, config: Any) -> DeployError:
    with pytest.raises(DeployError) as failed:
        deployer.deploy(config)
    return failed.value


def test_a_paused_or_stopped_container_is_its_nodes_and_a_native_hang_stays_the_configs(
    ssh_cluster: SshCluster, runtime: Runtime, tmp_path: Path
) -> None:
    """The engine's container is paused (``docker pause``) as it loads: its log stops and the
    boot wedges. The launcher's group (``docker wait``) runs on, nothing in it stopped, so this
    was the config's ``boot_wedge``; now the runtime is asked and it is ``engine_stopped`` on
    node 0, naming the container. A SIGSTOP sent to the container's own process (which Docker
    still calls running) is found in the container's processes. A native engine that hangs
    stays ``boot_wedge``, and the runtime is never asked about it."""

    def pause() -> None:
        runtime.container_pid()
        subprocess.run([str(runtime.docker), "pause", NAME], check=True)

    deployer, config = boot(ssh_cluster, tmp_path / "paused", container=True)
    try:
        with ThreadPoolExecutor(1) as pool:
            pausing = pool.submit(pause)
            err = failed_boot(deployer, config)
            pausing.result(timeout=30)
    finally:
        deployer.teardown()
        deployer.close()
    assert err.failure_class == "engine_stopped", err.message
    assert err.failure_class in INFRASTRUCTURE and err.rank == 0
    assert err.message.startswith("node-0: boot wedged"), err.message
    assert f"node-0's engine was found stopped on {ssh_cluster.node(0).address}: " in err.message
    assert f": container {NAME} paused (a SIGSTOP, a `docker pause`, " in err.message
    assert "inspect --type container --format" in "\n".join(runtime.calls())
    assert not (runtime.state / NAME).exists(), "the teardown's stop hook removed it"

    deployer, config = boot(ssh_cluster, tmp_path / "sigstop", container=True)
    stopped: list[int] = []

    def stop() -> None:
        stopped.append(runtime.container_pid())
        os.kill(stopped[0], signal.SIGSTOP)

    try:
        with ThreadPoolExecutor(1) as pool:
            stopping = pool.submit(stop)
            err = failed_boot(deployer, config)
            stopping.result(timeout=30)
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
        deployer.teardown()
        deployer.close()
    assert err.failure_class == "engine_stopped", err.message
    # its name is python's once the shim's fork has exec'd it; a SIGSTOP can come first
    assert f"pid {stopped[0]} (" in err.message
    assert f"stopped by a signal in container {NAME}" in err.message

    (runtime.state / "calls").unlink()
    deployer, config = boot(ssh_cluster, tmp_path / "native", container=False)
    try:
        err = failed_boot(deployer, config)
    finally:
        deployer.teardown()
        deployer.close()
    assert err.failure_class == "boot_wedge", err.message
    assert runtime.calls() == [], "a native engine's runtime is never asked"


def test_a_container_killed_from_outside_is_its_nodes_and_an_oom_kill_stays_the_configs(
    ssh_cluster: SshCluster, runtime: Runtime, tmp_path: Path
) -> None:
    """The container's process dies of a SIGTERM orchestrate did not send as the engine loads:
    ``docker wait`` exits 0, so the launcher's status says nothing, and this was the config's
    ``start``. Docker's exit code says 143: now ``engine_killed`` on node 0. A container the
    kernel's OOM killer ended (SIGKILL, ``OOMKilled``) stays the config's, as a native
    engine's OOM kill does."""
    killed: dict[str, DeployError] = {}
    for how, sig in (("term", signal.SIGTERM), ("oom", signal.SIGKILL)):
        deployer, config = boot(ssh_cluster, tmp_path / how, container=True)
        if how == "oom":
            (runtime.state / f"{NAME}.oom").write_text("")
        try:
            with ThreadPoolExecutor(1) as pool:

                def kill(sig: signal.Signals = sig) -> None:
                    os.kill(runtime.container_pid(), sig)

                killing = pool.submit(kill)
                killed[how] = failed_boot(deployer, config)
                killing.result(timeout=30)
        finally:
            deployer.teardown()
            deployer.close()
    term = killed["term"]
    assert term.failure_class == "engine_killed", term.message
    assert term.failure_class in INFRASTRUCTURE and term.rank == 0
    assert term.message.startswith("node-0: engine exited "), term.message
    assert f"killed by SIGTERM from outside on {ssh_cluster.node(0).address}" in term.message
    assert killed["oom"].failure_class == "start", killed["oom"].message


def test_the_container_is_the_one_an_adopted_launcher_names_and_a_native_one_names_none(
    tmp_path: Path,
) -> None:
    """``orchestrate init`` from a ``docker run --rm --name`` launcher (its argv) and from one
    without ``--rm`` (its stop hook's ``bash -c 'docker stop …; docker rm …'``): every node's
    engine is in the container the launcher names, so the runtime is asked of it. The twin's
    native launcher names none."""
    for launcher, name, hosts in (
        ("card002-v5-tp4.sh", "glm53-tp4", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4"),
        ("sm121-tp2-head-only.sh", "glm53-tp2", "10.0.0.1,10.0.0.2"),
    ):
        profile, _ = adopted(tmp_path, launcher, "--nodes", hosts)
        for node in profile.cluster.nodes:
            found = container_of(
                profile.launcher,
                profile.gates.stop_hook,
                profile.cluster,
                node,
                runtime_placeholders(),
            )
            assert found == name, (launcher, node.name)
    hook_only = profile.launcher.model_copy(update={"argv": ("bash", "run-engine.sh")})
    found = container_of(
        hook_only, profile.gates.stop_hook, profile.cluster, node, runtime_placeholders()
    )
    assert found == "glm53-tp2", "the stop hook names it where the launcher does not"
    twin = load_profile(str(write_profile(tmp_path, twin_profile_data(nodes=2))))
    for node in twin.cluster.nodes:
        assert container_of(twin.launcher, None, twin.cluster, node, runtime_placeholders()) is None


#: An engine that takes its SIGTERM as a clean stop: it exits 0.
CATCHER = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); time.sleep(600)"
)


def test_a_container_that_outlives_its_launchers_stop_is_stopped_before_the_node_is(
    ssh_cluster: SshCluster, runtime: Runtime, tmp_path: Path
) -> None:
    """``docker run -d`` then ``docker wait``, and no stop hook: the stop's SIGTERM ends the
    launcher's group (``docker wait``) and never reaches the container, which serves on.
    The teardown said ``stopped`` all the same, and the next boot met its port taken, said
    as "not this cluster's engine". Now the runtime is asked once the group is gone: the
    container still up is stopped with ``docker stop`` (its engine takes the SIGTERM and
    exits 0) and the node's line says so; a second teardown finds nothing left."""
    (tmp_path / "boot").mkdir()
    data = profile_data(ssh_cluster, container=True)
    data["launcher"]["argv"][2] = data["launcher"]["argv"][2].replace(SLEEPER, CATCHER)
    data["gates"].pop("stop_hook")
    prof = load_profile(str(write_profile(tmp_path / "boot", data)))
    deployer = deployer_for(prof)
    try:
        failed_boot(deployer, prof.initial_champion())
        engine = runtime.container_pid()
        outcomes = deployer.teardown()
        engine_gone = not Path(f"/proc/{engine}").exists()
        again = deployer.teardown()
    finally:
        deployer.close()
    assert outcomes[0] == (
        f"stopped: its container {NAME} outlived its launcher's stop (stopped) and was still "
        "up; stopped with `docker stop`"
    ), outcomes
    assert engine_gone, "the container's engine serves on after the node's stop"
    assert (runtime.state / NAME).read_text().split()[:3] == ["exited", "0", "0"]
    assert f"stop -t {int(prof.gates.stop_grace_s)} {NAME}" in runtime.calls()
    assert again[0] == "absent", again


def test_a_graceful_container_stopped_from_outside_is_its_nodes_an_exit_0_the_configs(
    ssh_cluster: SshCluster, runtime: Runtime, tmp_path: Path
) -> None:
    """A person's ``docker stop`` of the engine's container as it loads: the engine takes its
    SIGTERM as a clean stop and exits 0, so neither ``docker wait`` nor Docker's exit code
    says a signal, and this was the config's ``start``. Docker's events say it sent the
    container SIGTERM (a ``kill`` event) since it started, and our own stop marked nothing:
    now ``engine_killed`` on node 0. An engine that exits 0 on its own, with no signal sent,
    stays the config's."""
    failed: dict[str, DeployError] = {}
    for how in ("docker-stop", "own-exit"):
        directory = tmp_path / how
        directory.mkdir()
        data = profile_data(ssh_cluster, container=True)
        engine = CATCHER if how == "docker-stop" else "import time, sys; time.sleep(1); sys.exit(0)"
        data["launcher"]["argv"][2] = data["launcher"]["argv"][2].replace(SLEEPER, engine)
        prof = load_profile(str(write_profile(directory, data)))
        deployer = deployer_for(prof)
        try:
            with ThreadPoolExecutor(1) as pool:

                def stop(how: str = how) -> None:
                    runtime.container_pid()
                    if how == "docker-stop":
                        subprocess.run(
                            [str(runtime.docker), "stop", "-t", "5", NAME],
                            check=True,
                            capture_output=True,
                        )

                stopping = pool.submit(stop)
                failed[how] = failed_boot(deployer, prof.initial_champion())
                stopping.result(timeout=30)
        finally:
            deployer.teardown()
            deployer.close()
    outside = failed["docker-stop"]
    assert outside.failure_class == "engine_killed", outside.message
    assert outside.rank == 0 and outside.failure_class in INFRASTRUCTURE
    assert f"killed by SIGTERM from outside on {ssh_cluster.node(0).address}" in outside.message
    assert failed["own-exit"].failure_class == "start", failed["own-exit"].message
    assert any(call.startswith("events --since ") for call in runtime.calls())
