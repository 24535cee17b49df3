"""Where a node is and which host key it must show: ``~/.ssh/config`` resolved the way ``ssh``
resolves it (``Host`` aliases, ``HostName``, ``User``, ``Port``, ``IdentityFile``,
``ProxyJump``, ``HostKeyAlias``, ``UserKnownHostsFile``; the profile's own fields win), and a
paramiko client that trusts a pinned key or the known_hosts files and nothing else. The
connection itself is ``cluster.ssh``'s."""

from __future__ import annotations

import base64
import binascii
import contextlib
import getpass
import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import paramiko

from cluster.errors import NodeUnreachable

#: Where a person's ssh keeps its trust anchors, read when the profile names none.
USER_CONFIG = "~/.ssh/config"
USER_KNOWN_HOSTS = "~/.ssh/known_hosts"
SYSTEM_KNOWN_HOSTS = "/etc/ssh/ssh_known_hosts"
SSH_PORT = 22


@dataclass(frozen=True)
class Endpoint:
    """One SSH destination after ``~/.ssh/config``: what we connect to and as whom."""

    alias: str
    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    jumps: tuple[str, ...]
    host_key_alias: str | None
    known_hosts: tuple[str, ...]

    @property
    def where(self) -> str:
        """``user@host:port`` (and the alias it came from), for messages."""
        via = f" (Host {self.alias})" if self.alias != self.hostname else ""
        return f"{self.user}@{self.hostname}:{self.port}{via}"

    @property
    def known_hosts_name(self) -> str:
        """The name this host's key is filed under: ``host`` on port 22, else ``[host]:port``,
        or ``HostKeyAlias`` as is (what OpenSSH looks up)."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == SSH_PORT else f"[{self.hostname}]:{self.port}"

    def keyscan(self) -> str:
        """The ``ssh-keyscan`` line that prints this host's keys in known_hosts form."""
        port = f"-p {self.port} " if self.port != SSH_PORT else ""
        return f"ssh-keyscan {port}{shlex.quote(self.hostname)}"


def expand_path(path: str) -> str:
    return os.path.expanduser(os.path.expandvars(path))


def split_hop(hop: str) -> tuple[str | None, str, int | None]:
    """``[user@]host[:port]`` → (user, host, port)."""
    user, _, rest = hop.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:
        host, _, raw = rest.partition(":")
        port = int(raw) if raw.isdigit() else None
    return (user or None), host, port


def read_ssh_config(path: str | None) -> paramiko.SSHConfig:
    """The ssh config at ``path`` (default ``~/.ssh/config``); empty when there is none.

    Raises:
        NodeUnreachable: the file exists but cannot be read or parsed (class unreachable).
    """
    target = Path(expand_path(path or USER_CONFIG))
    if not target.is_file():
        if path is not None:
            raise NodeUnreachable(
                f"ssh config {target} named by the profile does not exist",
                failure_class="unreachable",
            )
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(str(target))
    except (OSError, paramiko.SSHException, ValueError) as e:
        raise NodeUnreachable(
            f"cannot read ssh config {target}: {e}", failure_class="unreachable"
        ) from e


def resolve(
    host: str,
    config: paramiko.SSHConfig,
    *,
    user: str | None = None,
    port: int | None = None,
    key_file: str | None = None,
    proxy_jump: str | None = None,
    known_hosts: str | None = None,
) -> Endpoint:
    """Where ``host`` leads after ``~/.ssh/config``; explicit arguments win over the config.

    Raises:
        NodeUnreachable: the config asks for something this transport will not do
            (``ProxyCommand``: it would run a local shell command; use ``ProxyJump``).
    """
    try:
        found = config.lookup(host)
    except (paramiko.SSHException, OSError, ImportError, ValueError) as e:
        raise NodeUnreachable(
            f"ssh config lookup of {host!r} failed: {e}", failure_class="unreachable"
        ) from e
    if "proxycommand" in found and proxy_jump is None and "proxyjump" not in found:
        raise NodeUnreachable(
            f"~/.ssh/config gives Host {host} a ProxyCommand, which orchestrate does not run; "
            "use ProxyJump (or the profile's ssh.proxy_jump) instead",
            failure_class="unreachable",
        )
    jump_text = proxy_jump if proxy_jump is not None else found.get("proxyjump")
    jumps: tuple[str, ...] = ()
    if jump_text and jump_text.lower() != "none":
        jumps = tuple(h.strip() for h in jump_text.split(",") if h.strip())
    files: list[str] = []
    if known_hosts is not None:
        files.append(expand_path(known_hosts))
    else:
        files += [expand_path(p) for p in str(found.get("userknownhostsfile", "")).split()]
        if not files:
            files.append(expand_path(USER_KNOWN_HOSTS))
        files.append(SYSTEM_KNOWN_HOSTS)
    keys = (key_file,) if key_file else tuple(found.get("identityfile", ()))
    raw_port = port or found.get("port")
    return Endpoint(
        alias=host,
        hostname=str(found.get("hostname", host)),
        port=int(raw_port) if raw_port else SSH_PORT,
        user=user or str(found.get("user") or getpass.getuser()),
        key_files=tuple(expand_path(k) for k in keys),
        jumps=jumps,
        host_key_alias=found.get("hostkeyalias"),
        known_hosts=tuple(files),
    )


class UnknownHostKey(paramiko.SSHException):
    """Raised by ``_Reject``: the server's key is in no trusted file. Carries the key."""

    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(f"Server {name!r} not found in known_hosts")
        self.name = name
        self.key = key


class _Reject(paramiko.RejectPolicy):
    """paramiko's ``RejectPolicy``: an unknown host key refuses the connection. We only keep
    the key the server presented, so the error can show its fingerprint to compare."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: Any) -> NoReturn:
        raise UnknownHostKey(hostname, key)


def parse_host_key(text: str) -> paramiko.PKey:
    """A pinned ``TYPE BASE64`` host key.

    Raises:
        ValueError: not a public key paramiko understands.
    """
    kind, _, data = text.strip().partition(" ")
    try:
        return paramiko.PKey.from_type_string(kind, base64.b64decode(data.split()[0]))
    except (binascii.Error, paramiko.SSHException, IndexError, ValueError) as e:
        raise ValueError(f"not an SSH public key: {kind} …") from e


def strict_client(ep: Endpoint, pinned: str | None) -> paramiko.SSHClient:
    """A client that trusts only ``pinned`` (a ``TYPE BASE64`` key), or else ``ep``'s known_hosts.

    Raises:
        ValueError: ``pinned`` is not an SSH public key.
    """
    client = paramiko.SSHClient()
    # Strict host-key checking, always: an unknown key is refused, never added or merely
    # warned about (no AutoAddPolicy/WarningPolicy): the first connection is exactly
    # when a man in the middle would be trusted forever.
    client.set_missing_host_key_policy(_Reject())
    if pinned is not None:
        # A key pinned in the profile is the only one trusted for this node: known_hosts
        # is not read, so a stale entry there cannot override the pin (paramiko consults
        # "system" host keys before the client's own).
        key = parse_host_key(pinned)
        client.get_host_keys().add(ep.known_hosts_name, key.get_name(), key)
    else:
        for path in ep.known_hosts:
            if os.path.isfile(path):
                # Loaded as "system" keys: read-only, paramiko never writes them back.
                with contextlib.suppress(OSError):
                    client.load_system_host_keys(path)
    return client
