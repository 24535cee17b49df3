"""The cluster inventory: nodes, ranks, addresses, where each node keeps its files."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from knobs.spec import SAFE_TOKEN

_HOST = re.compile(r"^[A-Za-z0-9_.:-]{1,253}$")


class SshSpec(BaseModel):
    """How to reach a node over SSH. Unset fields come from ``~/.ssh/config`` (``Host`` aliases,
    ``HostName``, ``User``, ``Port``, ``IdentityFile``, ``ProxyJump``), as with ``ssh``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(pattern=_HOST.pattern, description="address or ~/.ssh/config Host alias")
    user: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    port: int | None = Field(default=None, ge=1, le=65535)
    key_file: str | None = None
    # --- issue #4: pinned key, jump host, passphrase source --------------------------------
    host_key: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9@.-]{3,64} [A-Za-z0-9+/=]{16,8192}$",
        description="pinned host key 'TYPE BASE64' (what ssh-keyscan prints after the host); "
        "when set it is the only key trusted for this node, known_hosts is not consulted",
    )
    proxy_jump: str | None = Field(
        default=None,
        pattern=r"^(none|([a-z_][a-z0-9_-]{0,31}@)?[A-Za-z0-9_.:-]{1,253}"
        r"(,([a-z_][a-z0-9_-]{0,31}@)?[A-Za-z0-9_.:-]{1,253})*)$",
        description="jump host(s) as in ssh -J [user@]host[:port][,...]; 'none' ignores "
        "ProxyJump from ~/.ssh/config",
    )
    passphrase_env: str | None = Field(
        default=None,
        pattern=r"^[A-Z_][A-Z0-9_]{0,127}$",
        description="name of the environment variable holding key_file's passphrase (the "
        "passphrase itself never appears in a profile, a log or the ledger)",
    )


class SshOptionsSpec(BaseModel):
    """Cluster-wide SSH behaviour (issue #4). docs/deploy.md says why each value is what it is."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    connect_timeout_s: float = Field(
        default=10.0, gt=0, description="TCP connect and key exchange to one node"
    )
    banner_timeout_s: float = Field(
        default=15.0, gt=0, description="connected but no SSH banner: a hung or stopped sshd"
    )
    auth_timeout_s: float = Field(default=15.0, gt=0, description="the whole authentication")
    io_timeout_s: float = Field(
        default=15.0,
        gt=0,
        description="the server must answer a request (open a channel, start a command, an "
        "SFTP call) within this; silence means the node is unreachable",
    )
    alive_interval_s: float = Field(
        default=15.0,
        gt=0,
        description="keepalive interval on idle connections, and how long a running command may "
        "stay silent before the connection is probed (ssh's ServerAliveInterval)",
    )
    known_hosts: str | None = Field(
        default=None,
        description="known_hosts file to trust (default: UserKnownHostsFile from ~/.ssh/config, "
        "else ~/.ssh/known_hosts, plus /etc/ssh/ssh_known_hosts)",
    )
    config_file: str | None = Field(default=None, description="default: ~/.ssh/config")
    allow_agent: bool = Field(default=True, description="offer the keys of ssh-agent")


class NodeSpec(BaseModel):
    """One node: its rank, the address peers and clients use, and its working directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0, le=255)
    host: str = Field(pattern=_HOST.pattern, description="address the engine binds and peers use")
    workdir: str = Field(description="launchers, logs and pid files live here on the node")
    transport: Literal["local", "ssh"] = "local"
    ssh: SshSpec | None = None
    vars: dict[str, str] = Field(default_factory=dict, description="extra launcher placeholders")
    gpus: int = Field(
        default=1, ge=0, le=64, description="GPUs the node's engine holds (for GPU-hours)"
    )

    @model_validator(mode="after")
    def _safe(self) -> NodeSpec:
        if self.transport == "ssh" and self.ssh is None:
            raise ValueError(f"node rank {self.rank}: transport ssh needs an ssh section")
        if not SAFE_TOKEN.match(self.workdir):
            raise ValueError(f"node rank {self.rank}: workdir {self.workdir!r} is not a safe path")
        for name, value in self.vars.items():
            if not re.match(r"^[a-z_][a-z0-9_]{0,31}$", name):
                raise ValueError(
                    f"node rank {self.rank}: var name {name!r} is not a placeholder name "
                    "(lower case letters, digits and _, at most 32)"
                )
            if not SAFE_TOKEN.match(value):
                raise ValueError(
                    f"node rank {self.rank}: var {name}={value!r} is not a safe token (letters, "
                    "digits and _.:/+=@,%{}-, no spaces or quotes); a path with spaces "
                    "belongs in a symlink without them"
                )
        return self

    @property
    def name(self) -> str:
        """``node-R``."""
        return f"node-{self.rank}"


class ClusterSpec(BaseModel):
    """Every node of one cluster. Rank 0 is the head; it serves the HTTP endpoint."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    nodes: tuple[NodeSpec, ...] = Field(min_length=1)
    port: int = Field(default=8000, ge=1, le=65535, description="the head's HTTP port")
    master_port: int = Field(default=29520, ge=1, le=65535)
    ssh: SshOptionsSpec = Field(default_factory=SshOptionsSpec)  # issue #4
    auto_ports: bool = Field(
        default=False,
        description="`port: auto` (or `master_port: auto`) in a profile: both ports are chosen "
        "for this cluster when the profile loads (cluster/ports.py), issue #17",
    )

    @model_validator(mode="before")
    @classmethod
    def _auto(cls, data: object) -> object:
        if isinstance(data, dict) and "auto" in (data.get("port"), data.get("master_port")):
            # provisional: load_profile chooses the pair once the workdirs are resolved
            return {**data, "port": 20000, "master_port": 20001, "auto_ports": True}
        return data

    @model_validator(mode="after")
    def _ranks(self) -> ClusterSpec:
        ranks = sorted(n.rank for n in self.nodes)
        if ranks != list(range(len(self.nodes))):
            raise ValueError(f"node ranks must be 0..{len(self.nodes) - 1}, got {ranks}")
        places: dict[tuple[str, str], int] = {}
        for node in self.nodes:
            # two ranks in one folder of one machine share a launcher, a log and a pid file:
            # each boot would wedge or stop the other's engine, and the config be blamed
            machine = node.ssh.host if node.transport == "ssh" and node.ssh else "this machine"
            place = (machine, posixpath.normpath(node.workdir))
            other = places.setdefault(place, node.rank)
            if other != node.rank:
                raise ValueError(
                    f"nodes {other} and {node.rank} share the workdir {node.workdir!r} on "
                    f"{machine}: give each rank a workdir of its own"
                )
        return self

    @property
    def head(self) -> NodeSpec:
        """Rank 0."""
        return self.by_rank(0)

    def by_rank(self, rank: int) -> NodeSpec:
        """The node of ``rank``."""
        return next(n for n in self.nodes if n.rank == rank)

    @property
    def workers_desc(self) -> list[NodeSpec]:
        """Ranks N-1 … 1: the order workers start in."""
        return sorted((n for n in self.nodes if n.rank != 0), key=lambda n: -n.rank)

    def identity(self) -> str:
        """What tells this cluster from another: its name and every node's address and
        workdir (absolute once the profile is loaded)."""
        nodes = [[n.rank, n.host, n.workdir] for n in sorted(self.nodes, key=lambda n: n.rank)]
        return json.dumps({"name": self.name, "nodes": nodes}, sort_keys=True)

    @property
    def token(self) -> str:
        """The rendezvous token (issue #17): a worker presents it and the head refuses a worker
        that brings another, so a worker never joins another cluster's head."""
        text = f"{self.identity()} {self.port} {self.master_port}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    @property
    def base_url(self) -> str:
        """The head's HTTP endpoint."""
        return f"http://{self.head.host}:{self.port}"
