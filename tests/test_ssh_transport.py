"""The SSH transport against real OpenSSH servers (``tests/fixtures/sshd.py``): argv quoting,
connection reuse, SFTP, ~/.ssh/config, the agent, ProxyJump, strict host keys, keys and
passphrases, and real faults (sshd killed or stopped, a link cut, a slow command)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.errors import NodeError, NodeUnreachable
from cluster.inventory import NodeSpec, SshOptionsSpec
from cluster.ssh import SshTransport
from cluster.ssh_login import safe_message
from tests.fixtures.sshd import SshCluster
from tests.fixtures.wait import wait_until


def transport(
    cluster: SshCluster, rank: int, ssh: dict[str, Any] | None = None, **options: Any
) -> SshTransport:
    """Node ``rank`` of the test hosts, its ssh section and cluster options overridden."""
    data = cluster.node_data(cluster.node(rank))
    for key, value in (ssh or {}).items():
        if value is None:
            data["ssh"].pop(key, None)
        else:
            data["ssh"][key] = value
    base = {
        "connect_timeout_s": 3,
        "banner_timeout_s": 2,
        "auth_timeout_s": 5,
        "io_timeout_s": 2,
        "alive_interval_s": 2,
        "config_file": str(cluster.ssh_config),
        "allow_agent": False,
    }
    return SshTransport(NodeSpec.model_validate(data), SshOptionsSpec(**{**base, **options}))


@pytest.fixture
def closing() -> Iterator[list[SshTransport]]:
    """Transports to close at the end of the test."""
    opened: list[SshTransport] = []
    yield opened
    for t in opened:
        t.close()


def accepted(cluster: SshCluster, rank: int) -> int:
    """How many logins node ``rank``'s sshd has accepted (its own log)."""
    return cluster.node(rank).sshd_log.read_text().count("Accepted publickey")


def test_argv_reaches_the_node_word_for_word(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    t = transport(ssh_cluster, 1)
    closing.append(t)
    marker = ssh_cluster.node(1).workdir / "injected"
    tokens = [
        "plain",
        "two words",
        f"$(touch {marker})",
        f"`touch {marker}`; touch {marker}",
        'it\'s "quoted"',
        "glob *",
        "new\nline",
        "",
    ]
    result = t.run(["printf", "<%s>\\n", *tokens])
    assert result.returncode == 0, result.stderr
    assert result.stdout == "".join(f"<{tok}>\n" for tok in tokens)
    assert not marker.exists()
    failed = t.run(["bash", "-c", "echo out; echo err >&2; exit 7"])
    assert (failed.returncode, failed.stdout, failed.stderr) == (7, "out\n", "err\n")
    with pytest.raises(ValueError):
        t.run(["echo", "nul\x00byte"])


def test_one_connection_serves_every_command_and_file(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    t = transport(ssh_cluster, 2)
    closing.append(t)
    before = accepted(ssh_cluster, 2)
    path = str(ssh_cluster.node(2).workdir / "deep" / "er" / "launcher.sh")
    for i in range(5):
        assert t.run(["echo", str(i)]).stdout == f"{i}\n"
        t.put_text(path, f"#!/bin/sh\necho {i}\n", mode=0o750)
        assert t.read_text(path) == f"#!/bin/sh\necho {i}\n"
    assert t.connections == 1
    assert accepted(ssh_cluster, 2) - before == 1
    assert oct(Path(path).stat().st_mode & 0o777) == "0o750"
    assert not list(Path(path).parent.glob("*.tmp")), "the temporary upload was left behind"
    assert t.read_text(path, max_bytes=7) == "echo 4\n"
    assert t.read_text(str(ssh_cluster.node(2).workdir / "missing.log")) == ""


def test_ssh_config_alias_user_port_and_identity_file(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    node = ssh_cluster.node(3)
    ssh_cluster.ssh_config.write_text(
        f"Host spark-4\n  HostName {node.address}\n  Port {node.port}\n"
        f"  User {ssh_cluster.user}\n  IdentityFile {ssh_cluster.user_key}\n"
    )
    try:
        t = transport(
            ssh_cluster, 3, {"host": "spark-4", "port": None, "user": None, "key_file": None}
        )
        closing.append(t)
        assert t.endpoint.where == f"{ssh_cluster.user}@{node.address}:{node.port} (Host spark-4)"
        assert t.run(["echo", "via alias"]).stdout == "via alias\n"
    finally:
        ssh_cluster.ssh_config.write_text("")


def test_agent_keys_are_offered(
    ssh_cluster: SshCluster,
    closing: list[SshTransport],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(
        ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_until("ssh-agent to create its socket", sock.exists, 10)
        env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
        subprocess.run(["ssh-add", "-q", str(ssh_cluster.user_key)], env=env, check=True)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/id_* of the developer's
        t = transport(ssh_cluster, 0, {"key_file": None}, allow_agent=True)
        closing.append(t)
        assert t.run(["echo", "agent"]).stdout == "agent\n"
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=10)


def test_proxy_jump_goes_through_the_jump_host(
    ssh_cluster: SshCluster, closing: list[SshTransport], tmp_path: Path
) -> None:
    jump, target = ssh_cluster.node(0), ssh_cluster.node(3)
    known = tmp_path / "known_hosts"
    known.write_text(f"[{jump.address}]:{jump.port} {jump.host_key_line}\n")
    ssh_cluster.ssh_config.write_text(f"Host *\n  IdentityFile {ssh_cluster.user_key}\n")
    try:
        t = transport(
            ssh_cluster,
            3,
            {"proxy_jump": f"{ssh_cluster.user}@{jump.address}:{jump.port}"},
            known_hosts=str(known),
        )
        closing.append(t)
        before = target.sshd_log.read_text()
        assert t.run(["echo", "jumped"]).stdout == "jumped\n"
        new = target.sshd_log.read_text()[len(before) :]
        if ssh_cluster.mode == "netns":
            # the target saw the jump host's address, not ours
            assert f"Connection from {jump.address} " in new, new
        assert f"Accepted publickey for {ssh_cluster.user}" in new
        assert "Accepted publickey" in jump.sshd_log.read_text()
    finally:
        ssh_cluster.ssh_config.write_text("")


def test_unknown_host_key_is_refused_and_the_error_says_how_to_trust_it(
    ssh_cluster: SshCluster, closing: list[SshTransport], tmp_path: Path
) -> None:
    node = ssh_cluster.node(2)
    known = tmp_path / "known_hosts"
    known.write_text("")
    before = accepted(ssh_cluster, 2)
    t = transport(ssh_cluster, 2, {"host_key": None}, known_hosts=str(known))
    closing.append(t)
    with pytest.raises(NodeUnreachable) as info:
        t.run(["true"])
    err = info.value
    assert (err.failure_class, err.exit_code, err.rank) == ("host_key", 5, 2)
    assert f"{ssh_cluster.user}@{node.address}:{node.port}" in err.message
    assert "unknown host key" in err.message
    fingerprint = subprocess.run(
        ["ssh-keygen", "-lf", f"{node.host_key}.pub"], capture_output=True, text=True, check=True
    ).stdout.split()[1]
    assert fingerprint in err.message
    assert node.host_key_line in err.message  # the profile field to pin it
    assert accepted(ssh_cluster, 2) == before, "we authenticated to an untrusted server"
    # the printed instruction works: run its ssh-keyscan into our known_hosts, then connect
    scan = re.search(r"(ssh-keyscan [^>]+) >> ~/.ssh/known_hosts", err.message)
    assert scan is not None, err.message
    scanned = subprocess.run(
        [*scan.group(1).split(), "-t", "ed25519"], capture_output=True, text=True, check=True
    )
    known.write_text(scanned.stdout)
    subprocess.run(["ssh-keygen", "-H", "-f", str(known)], capture_output=True, check=True)
    assert "|1|" in known.read_text()  # hashed entries, as Debian's ssh writes them
    assert t.run(["echo", "trusted"]).stdout == "trusted\n"


@pytest.mark.parametrize("where", ["known_hosts", "pinned"])
def test_changed_host_key_is_refused(
    ssh_cluster: SshCluster, closing: list[SshTransport], tmp_path: Path, where: str
) -> None:
    node = ssh_cluster.node(1)
    known = tmp_path / "known_hosts"
    if where == "known_hosts":
        known.write_text(f"[{node.address}]:{node.port} {ssh_cluster.other_pub}\n")
        t = transport(ssh_cluster, 1, {"host_key": None}, known_hosts=str(known))
    else:
        # a correct known_hosts entry does not override a pin
        known.write_text(f"[{node.address}]:{node.port} {node.host_key_line}\n")
        t = transport(ssh_cluster, 1, {"host_key": ssh_cluster.other_pub}, known_hosts=str(known))
    closing.append(t)
    with pytest.raises(NodeUnreachable) as info:
        t.run(["true"])
    assert info.value.failure_class == "host_key"
    assert "host key CHANGED" in info.value.message
    assert f"ssh-keygen -R '[{node.address}]:{node.port}'" in info.value.message


def test_wrong_user_key_is_an_auth_failure(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    t = transport(ssh_cluster, 3, {"key_file": str(ssh_cluster.other_key)})
    closing.append(t)
    with pytest.raises(NodeUnreachable) as info:
        t.run(["true"])
    err = info.value
    assert (err.failure_class, err.exit_code) == ("auth", 5)
    assert f"authentication as {ssh_cluster.user!r} failed" in err.message
    assert str(ssh_cluster.other_key) in err.message
    missing = transport(ssh_cluster, 3, {"key_file": "/nonexistent/key"})
    closing.append(missing)
    with pytest.raises(NodeUnreachable, match="does not exist on this machine"):
        missing.run(["true"])


def test_passphrase_comes_from_the_environment_and_never_leaks(
    ssh_cluster: SshCluster, closing: list[SshTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = {"key_file": str(ssh_cluster.locked_key), "passphrase_env": "TEST_KEY_PASSPHRASE"}
    monkeypatch.delenv("TEST_KEY_PASSPHRASE", raising=False)
    t = transport(ssh_cluster, 0, locked)
    closing.append(t)
    with pytest.raises(NodeUnreachable, match="is encrypted and no passphrase was given"):
        t.run(["true"])
    monkeypatch.setenv("TEST_KEY_PASSPHRASE", ssh_cluster.passphrase[::-1])
    with pytest.raises(NodeUnreachable) as info:
        t.run(["true"])
    assert info.value.failure_class == "auth"
    monkeypatch.setenv("TEST_KEY_PASSPHRASE", ssh_cluster.passphrase)
    assert t.run(["echo", "unlocked"]).stdout == "unlocked\n"
    for text in (info.value.evidence(), str(info.value), repr(t), repr(vars(t))):
        assert ssh_cluster.passphrase not in text
        assert ssh_cluster.passphrase[::-1] not in text


def test_killed_sshd_is_unreachable(ssh_cluster: SshCluster, closing: list[SshTransport]) -> None:
    node = ssh_cluster.node(2)
    t = transport(ssh_cluster, 2)
    closing.append(t)
    assert t.run(["true"]).returncode == 0
    node.kill_sshd()
    started = time.monotonic()
    with pytest.raises(NodeUnreachable) as info:
        t.run(["true"])
    assert info.value.failure_class == "unreachable"
    assert "connection refused" in info.value.message
    assert f"{node.address}:{node.port}" in info.value.message
    assert time.monotonic() - started < 5
    node.start_sshd()
    assert t.run(["echo", "back"]).stdout == "back\n"
    assert t.connections == 2


def test_stopped_sshd_is_unreachable_on_open_and_new_connections(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    node = ssh_cluster.node(1)
    t = transport(ssh_cluster, 1)
    closing.append(t)
    assert t.run(["true"]).returncode == 0
    node.freeze_sshd()
    for expected in ("stopped answering while opening a channel", "no SSH handshake within 2s"):
        started = time.monotonic()
        with pytest.raises(NodeUnreachable) as info:
            t.run(["true"])
        assert info.value.failure_class == "unreachable"
        assert expected in info.value.message
        assert time.monotonic() - started < 4, "io/banner timeouts are 2 s"
    node.thaw_sshd()
    assert t.run(["echo", "thawed"]).stdout == "thawed\n"


def test_stopped_sshd_during_a_command_and_an_upload(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    node = ssh_cluster.node(0)
    t = transport(ssh_cluster, 0)
    closing.append(t)
    t.put_text(str(node.workdir / "x"), "x")
    flag = node.workdir / "started"
    node_pids = node.sshd_pids

    def freeze_when_started() -> None:
        with contextlib.suppress(TimeoutError):  # frozen either way; the test then says why
            wait_until("the remote command to start", flag.exists, 10, interval=0.01)
        for pid in node_pids():
            os.kill(pid, signal.SIGSTOP)

    freezer = threading.Thread(target=freeze_when_started)
    freezer.start()
    started = time.monotonic()
    with pytest.raises(NodeUnreachable, match="stopped answering while the command ran"):
        t.run(["bash", "-c", f"touch {flag}; sleep 30"], timeout=60)
    freezer.join()
    assert time.monotonic() - started < 10, "noticed by the alive probe, not the 60 s timeout"
    with pytest.raises(NodeUnreachable):
        t.put_text(str(node.workdir / "y"), "y")
    node.thaw_sshd()
    t.put_text(str(node.workdir / "y"), "y")
    assert (node.workdir / "y").read_text() == "y"


def test_cut_link_is_unreachable(ssh_cluster: SshCluster, closing: list[SshTransport]) -> None:
    node = ssh_cluster.node(2)
    t = transport(ssh_cluster, 2)
    closing.append(t)
    assert t.run(["true"]).returncode == 0
    node.cut_link()
    with pytest.raises(NodeUnreachable, match="stopped answering"):
        t.run(["true"])
    fresh = transport(ssh_cluster, 2)
    closing.append(fresh)
    with pytest.raises(NodeUnreachable, match="no answer within 3s"):
        fresh.run(["true"])
    node.restore_link()
    assert t.run(["echo", "linked"]).stdout == "linked\n"


def test_slow_command_on_a_live_node_is_a_timeout_not_unreachable(
    ssh_cluster: SshCluster, closing: list[SshTransport]
) -> None:
    t = transport(ssh_cluster, 3, alive_interval_s=0.5)
    closing.append(t)
    # silent for longer than alive_interval_s: probed, found alive, left to finish
    assert t.run(["bash", "-c", "sleep 1.5; echo done"], timeout=30).stdout == "done\n"
    with pytest.raises(NodeError) as info:
        t.run(["sleep", "5"], timeout=1)
    assert not isinstance(info.value, NodeUnreachable)
    assert info.value.failure_class == "remote_failed"
    assert "did not finish within 1s" in info.value.message


def test_a_long_connection_error_is_cut_at_a_word_boundary() -> None:
    """An SSH error's message in a node's line: bounded, cut between words and marked."""
    said = safe_message(OSError("connection failed: " + "host unreachable " * 40))
    assert len(said) <= 300 and said.endswith("…"), said
    assert said[:-1].split()[-1] in ("host", "unreachable"), said  # a whole word
