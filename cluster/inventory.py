"""The cluster inventory: nodes, ranks, addresses, where each node keeps its files."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from knobs.spec import SAFE_TOKEN

_HOST = re.compile(r"^[A-Za-z0-9_.:-]{1,253}$")


class SshSpec(BaseModel):
    """How to reach a node over SSH (issue #4 fills in the transport)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str = Field(pattern=_HOST.pattern)
    user: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    port: int | None = Field(default=None, ge=1, le=65535)
    key_file: str | None = None
    host_key: str | None = None


class NodeSpec(BaseModel):
    """One node: its rank, the address peers and clients use, and its working directory."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rank: int = Field(ge=0, le=255)
    host: str = Field(pattern=_HOST.pattern, description="address the engine binds and peers use")
    workdir: str = Field(description="launchers, logs and pid files live here on the node")
    transport: Literal["local", "ssh"] = "local"
    ssh: SshSpec | None = None
    vars: dict[str, str] = Field(default_factory=dict, description="extra launcher placeholders")

    @model_validator(mode="after")
    def _safe(self) -> NodeSpec:
        if self.transport == "ssh" and self.ssh is None:
            raise ValueError(f"node rank {self.rank}: transport ssh needs an ssh section")
        if not SAFE_TOKEN.match(self.workdir):
            raise ValueError(f"node rank {self.rank}: workdir {self.workdir!r} is not a safe path")
        for name, value in self.vars.items():
            if not re.match(r"^[a-z_][a-z0-9_]{0,31}$", name) or not SAFE_TOKEN.match(value):
                raise ValueError(f"node rank {self.rank}: var {name}={value!r} is not safe")
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

    @model_validator(mode="after")
    def _ranks(self) -> ClusterSpec:
        ranks = sorted(n.rank for n in self.nodes)
        if ranks != list(range(len(self.nodes))):
            raise ValueError(f"node ranks must be 0..{len(self.nodes) - 1}, got {ranks}")
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

    @property
    def base_url(self) -> str:
        """The head's HTTP endpoint."""
        return f"http://{self.head.host}:{self.port}"
