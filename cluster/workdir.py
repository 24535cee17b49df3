"""A node's workdir that its file system refuses: the setup's to fix, never a node away.

The claim (``cluster.claims``) and ``orchestrate cluster check`` both meet a workdir the node
cannot write: a read-only file system, a folder of another user's, a regular file in its path,
a full disk. The node answered, so no waiting fixes it: ``refused`` reads the node's own words
(its shell runs in the C locale, so they are in English) and says the node, the path, why and
what to do, as ``WorkdirUnwritable`` (exit 6). Words it does not know (an I/O error, a stale
NFS handle) stay the node's: a failure the caller may wait out.

``writable`` is the check's probe: over the node's own transport it creates the workdir and a
file in it, and removes what it made, so a check leaves the node as it found it. Only POSIX
sh tools run (sh, mkdir, touch, rm, rmdir, dirname); the workdir is validated by the
inventory and every value is ``shlex.quote``d.
"""

from __future__ import annotations

import re
import shlex
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from cluster.errors import NodeError, WorkdirUnwritable
from cluster.inventory import NodeSpec
from cluster.transport import CommandResult, Transport, failed

#: What a node's shell says where its file system refuses the workdir: the cause in words,
#: and what a person does about it.
_WRITABLE = "make the folder writable on the node"
_IN_THE_WAY = "move that file aside on the node"
_REFUSALS: tuple[tuple[str, str, str], ...] = (
    ("Read-only file system", "a read-only file system", _WRITABLE),
    ("Permission denied", "permission denied", _WRITABLE),
    ("Operation not permitted", "operation not permitted", _WRITABLE),
    ("Not a directory", "a regular file is in its path", _IN_THE_WAY),
    ("File exists", "a file is in its place", _IN_THE_WAY),
    ("No space left on device", "the node's disk is full", "free space on the node's disk"),
    ("Disk quota exceeded", "the user's disk quota is spent", "free space within the quota"),
)
_PRINTABLE = re.compile(r"[^\x20-\x7e]")


def last_words(result: CommandResult) -> str:
    """The node's last line on stderr, fit to print on one line (it may be anyone's)."""
    said = [line for line in result.stderr.splitlines() if line.strip()]
    return _PRINTABLE.sub("?", said[-1])[:300] if said else "nothing on stderr"


def refused(node: NodeSpec, result: CommandResult) -> NodeError | None:
    """The workdir refusal ``result`` shows (a ``WorkdirUnwritable``), said with the node,
    the path, why and what to do; None where the node's words name none."""
    found = next((r for r in _REFUSALS if r[0] in result.stderr), None)
    if result.returncode == 0 or found is None:
        return None
    _, cause, todo = found
    return failed(
        result,
        node,
        f"{node.name} ({node.host}): its workdir {node.workdir} cannot be written ({cause}: "
        f"{last_words(result)}), and the claim and the engine's files go there; waiting will "
        f"not fix it: {todo}, or point the node's workdir (the profile's cluster.nodes entry "
        f"of rank {node.rank}; a relative one is under the folder the command runs in) at a "
        "writable folder",
        WorkdirUnwritable,
    )


def _probe_command(node: NodeSpec) -> list[str]:
    """sh that makes the workdir and a file in it, removes what it made, and prints
    ``writable``; else exits 3 with the node's words on stderr."""
    w = shlex.quote(node.workdir)
    p = shlex.quote(f"{node.workdir}/.orchestrate-write-check.{uuid.uuid4().hex}")
    body = (
        "LC_ALL=C; export LC_ALL; "
        # the topmost folder the probe makes (none where the workdir is there), to remove
        f"top={w}; new=; "
        'while [ ! -e "$top" ] && [ ! -L "$top" ]; do new=$top; top=$(dirname -- "$top"); done; '
        f"said=$(mkdir -p -- {w} 2>&1 && touch -- {p} 2>&1); rc=$?; "
        f"rm -f -- {p} 2>/dev/null; "
        f'if [ -n "$new" ]; then d={w}; '
        'while rmdir -- "$d" 2>/dev/null && [ "$d" != "$new" ]; do d=$(dirname -- "$d"); done; '
        "fi; "
        '[ "$rc" = 0 ] || { printf "%s\\n" "$said" >&2; exit 3; }; echo writable'
    )
    return ["sh", "-c", body]


def writable(node: NodeSpec, transport: Transport) -> None:
    """The node's workdir can be made and written (left as it was found).

    Raises:
        WorkdirUnwritable: the node's file system refuses it (exit 6).
        NodeError: the node could not be reached, or the probe failed otherwise.
    """
    result = transport.run(_probe_command(node), timeout=60)
    if result.returncode != 0:
        raise refused(node, result) or failed(
            result,
            node,
            f"writing to its workdir {node.workdir} failed on {node.name} ({node.host}) with "
            f"exit code {result.returncode}: {last_words(result)}",
        )


def every_workdir(
    nodes: Sequence[NodeSpec], transports: Mapping[int, Transport]
) -> dict[int, NodeError | None]:
    """``writable`` on every node at once: rank → its error, or None."""

    def one(node: NodeSpec) -> NodeError | None:
        try:
            writable(node, transports[node.rank])
        except NodeError as e:
            return e
        return None

    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        return dict(zip((n.rank for n in nodes), pool.map(one, nodes), strict=True))
