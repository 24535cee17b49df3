"""Transports run argv lists on a node: locally (subprocess) or over SSH (issue #4).

Both take an argv list, never a shell string. Anything that must run through a shell on the
node is built with ``shlex.join``/``shlex.quote`` from validated tokens by the caller.

This module holds the ``Transport`` protocol, ``CommandResult`` and ``LocalTransport``;
``cluster.ssh`` holds ``SshTransport``, and ``cluster.connect.open_transport`` picks one per node.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from cluster.errors import NodeError, NodeUnreachable, tail
from cluster.inventory import NodeSpec


class CommandResult(BaseModel):
    """What a command on a node returned."""

    model_config = ConfigDict(frozen=True)

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def command(self) -> str:
        """The command as a shell-quoted line (for evidence)."""
        return shlex.join(self.argv)


class Transport(Protocol):
    """Runs commands and moves files on one node."""

    node: NodeSpec

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` on the node and wait for it.

        Raises:
            NodeUnreachable: the node cannot be reached.
            NodeError: the command did not finish within ``timeout`` (class remote_failed).
        """
        ...

    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write ``text`` to ``path`` on the node (parents created).

        Raises:
            NodeError: the file could not be written (class upload).
        """
        ...

    def read_text(self, path: str, *, max_bytes: int = 1_000_000) -> str:
        """The last ``max_bytes`` of file ``path`` on the node, '' if it does not exist."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...


def failed(
    result: CommandResult, node: NodeSpec, message: str, kind: type[NodeError] = NodeError
) -> NodeError:
    """The error (``kind``, class remote_failed) of a command that failed on ``node``, said in
    ``message``, with the command, its exit code and the tail of its stderr as evidence."""
    return kind(
        message,
        failure_class="remote_failed",
        rank=node.rank,
        host=node.host,
        command=result.command,
        returncode=result.returncode,
        stderr_tail=tail(result.stderr, 15),
    )


def check(result: CommandResult, node: NodeSpec, what: str) -> CommandResult:
    """``result`` if it succeeded.

    Raises:
        NodeError: non-zero exit (class remote_failed) with the command and stderr tail.
    """
    if result.returncode != 0:
        raise failed(
            result,
            node,
            f"{what} failed on {node.name} ({node.host}) with exit code {result.returncode}",
        )
    return result


class LocalTransport:
    """The embedded cluster: every node is this machine, each with its own working directory."""

    def __init__(self, node: NodeSpec) -> None:
        self.node = node

    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` as a local subprocess (no shell).

        Raises:
            NodeUnreachable: the program does not exist.
            NodeError: timeout (class remote_failed).
        """
        try:
            done = subprocess.run(
                list(argv),
                capture_output=True,
                text=True,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        except FileNotFoundError as e:
            raise NodeUnreachable(
                f"{self.node.name}: cannot run {argv[0]!r}: {e.strerror}",
                failure_class="unreachable",
                rank=self.node.rank,
                host=self.node.host,
                command=shlex.join(argv),
            ) from e
        except subprocess.TimeoutExpired as e:
            raise NodeError(
                f"{self.node.name}: command did not finish within {timeout:g}s",
                failure_class="remote_failed",
                rank=self.node.rank,
                host=self.node.host,
                command=shlex.join(argv),
            ) from e
        return CommandResult(
            argv=tuple(argv), returncode=done.returncode, stdout=done.stdout, stderr=done.stderr
        )

    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Write a local file.

        Raises:
            NodeError: class upload.
        """
        target = Path(path)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".tmp")
            tmp.write_text(text)
            os.chmod(tmp, mode)
            tmp.replace(target)
        except OSError as e:
            raise NodeError(
                f"{self.node.name}: cannot write {path}: {e.strerror}",
                failure_class="upload",
                rank=self.node.rank,
                host=self.node.host,
            ) from e

    def read_text(self, path: str, *, max_bytes: int = 1_000_000) -> str:
        """The tail of a local file, '' if missing."""
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Nothing to release."""
