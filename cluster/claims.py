"""One owner per node (issue #17): a claim on every node, kept on the node itself.

Whatever ledger an orchestrator writes to, the nodes it drives are the same, so the claim lives
on them: ``<workdir>/.orchestrate-claim/``, made with ``mkdir`` (atomic: of two orchestrators
that try at once, one makes it), holding ``holder.json`` (the holder id, what holds it, the
cluster, the ledger URL with its password hidden, user, host and pid: never a secret),
``expires`` (unix seconds on the NODE's clock, so the machines' clocks need not agree) and
``id`` (the holder id, written last: a claim without it is being made, or its maker died
making it). The holder renews ``expires`` every third of the TTL and at each of the round's
safe points, checking that ``id`` is still its own, and removes the directory when it is done.
A renewal that finds the claim gone or another's says what it found there and when (the
round then says whether anyone recorded breaking it); one the node's file system refuses (an
I/O error, a stale NFS handle) is no claim lost: ``check`` says it once, in the node's words.

A claim is stale when ``expires`` has passed on the node's clock, when its holder ran on this
machine and that process is gone, or when it was never finished (``cluster.claim_holder``): it is
taken over, with a line saying so. A live claim refuses the newcomer (``ClaimHeld``, exit 8)
unless it is broken by force (``orchestrate cluster up|down --force``), which the caller records.

Only POSIX sh tools run on the node (sh, mkdir, cat, date, printf, mv, rm); every value in a
remote command is validated (workdirs by the inventory) or made here (ids, numbers, ASCII JSON)
and ``shlex.quote``d.
"""

from __future__ import annotations

import contextlib
import shlex
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType

from cluster.claim_holder import Holder, Seen, printable, same_process
from cluster.errors import (
    ClaimHeld,
    ClaimLost,
    NodeError,
    NodeUnreachable,
    of_node,
)
from cluster.inventory import ClusterSpec, NodeSpec
from cluster.transport import CommandResult, Transport, check, failed
from cluster.workdir import last_words, refused

#: The claim's directory in a node's workdir.
CLAIM_DIR = ".orchestrate-claim"
#: A claim being made (no ``id`` yet) is looked at again this many times, 0.1 s apart.
_LOOKS = 5

Note = Callable[[str], None]


def _utc(when: float) -> str:
    """Unix seconds as ``2026-12-07 08:41:09 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))


def _dir(node: NodeSpec) -> str:
    return shlex.quote(f"{node.workdir}/{CLAIM_DIR}")


def _show(d: str) -> str:
    """sh that prints ``held``, the node's time, the claim's expiry, its id and holder."""
    return (
        'echo held; echo "now $(date +%s)"; '
        f'echo "expires $(cat {d}/expires 2>/dev/null)"; echo "id $(cat {d}/id 2>/dev/null)"; '
        f"cat {d}/holder.json 2>/dev/null; exit 0"
    )


def _parse_seen(stdout: str) -> Seen:
    lines = stdout.splitlines()
    fields = dict(line.partition(" ")[::2] for line in lines[1:4])
    now, expires = fields.get("now", ""), fields.get("expires", "").strip()
    left = int(expires) - int(now) if expires.isdigit() and now.isdigit() else None
    holder_id = fields.get("id", "").strip()
    if not holder_id:
        return Seen(holder=None, left_s=left)
    return Seen(holder=Holder.parse("\n".join(lines[4:]), printable(holder_id, 64)), left_s=left)


def _take_command(node: NodeSpec, holder: Holder, ttl_s: float) -> list[str]:
    d = _dir(node)
    body = (
        # the node's own words for a refusal, in English and ASCII, whatever its locale
        "LC_ALL=C; export LC_ALL; "
        f"mkdir -p {shlex.quote(node.workdir)} || exit 3; "
        f"if said=$(mkdir {d} 2>&1); then "
        f"printf '%s\\n' {shlex.quote(holder.to_json())} >{d}/holder.json && "
        f"echo $(( $(date +%s) + {int(ttl_s)} )) >{d}/expires && "
        f"printf '%s\\n' {holder.id} >{d}/id && echo taken; exit $?; fi; "
        # not made and not there: why mkdir could not, for the error to say
        f'[ -d {d} ] || {{ printf "%s\\n" "$said" >&2; exit 3; }}; ' + _show(d)
    )
    return ["sh", "-c", body]


def _renew_command(node: NodeSpec, holder: Holder, ttl_s: float) -> list[str]:
    """sh that renews the claim while its id is ``holder``'s, else shows the claim there
    (``_show``). An id the node's file system cannot read (an I/O error, a stale NFS handle)
    is no claim lost: exit 3 with the node's words."""
    d = _dir(node)
    body = (
        "LC_ALL=C; export LC_ALL; "
        f'if ! got=$(cat {d}/id 2>&1); then case "$got" in '
        '*"No such file or directory"*) got=;; *) printf "%s\n" "$got" >&2; exit 3;; esac; fi; '
        f'[ "$got" = {holder.id} ] || {{ {_show(d)}; }}; '
        f"echo $(( $(date +%s) + {int(ttl_s)} )) >{d}/expires.tmp && "
        f"mv -f {d}/expires.tmp {d}/expires && echo renewed"
    )
    return ["sh", "-c", body]


def _remove_command(node: NodeSpec, holder_id: str, by: str, how: str) -> list[str]:
    """sh that removes the claim if its id is still ``holder_id`` ('' for one being made)."""
    d = _dir(node)
    trash = shlex.quote(f"{node.workdir}/{CLAIM_DIR}.{how}.{by}")
    body = (
        f'[ "$(cat {d}/id 2>/dev/null)" = {shlex.quote(holder_id)} ] && '
        f"mv {d} {trash} && rm -rf {trash} && echo {how}; exit 0"
    )
    return ["sh", "-c", body]


def _not_taken(node: NodeSpec, result: CommandResult) -> NodeError:
    """Why a claim could not be made, as the node said it: a workdir its file system refuses
    (``WorkdirUnwritable``: read-only, another user's, a file in its path, a full disk; no
    waiting fixes it), else the node's own last line."""
    return refused(node, result) or failed(
        result,
        node,
        f"claiming the node failed on {node.name} ({node.host}) with exit code "
        f"{result.returncode}: {last_words(result)}",
    )


class NodeClaims:
    """Claims every node of ``cluster`` for ``holder`` while in a ``with`` block, renewing the
    claims in the background; ``check()`` renews them at once and says if one was lost.
    ``gone`` is set the moment a renewal finds a claim another's or gone, from whichever thread
    finds it (the renewal's, on waking from a suspension): a bench cell in flight stops at it
    (``cluster.cutoff``), as it does at a lost lease; ``check()`` then says which node's claim
    and who holds it now."""

    def __init__(
        self,
        cluster: ClusterSpec,
        transports: Mapping[int, Transport],
        holder: Holder,
        *,
        ttl_s: float = 120.0,
        force: bool = False,
        note: Note | None = None,
        broken: Callable[[NodeSpec, Seen, str], None] | None = None,
        skip_unreachable: bool = False,
        gone: threading.Event | None = None,
    ) -> None:
        self.cluster = cluster
        self.transports = dict(transports)
        self.holder = holder
        self.ttl_s = ttl_s
        self.force = force
        self._note = note or (lambda _line: None)
        self._broken = broken or (lambda _node, _seen, _why: None)
        self.skip_unreachable = skip_unreachable
        self.held: list[NodeSpec] = []
        self.lost: ClaimLost | None = None
        self.gone = gone or threading.Event()
        #: when each node's claim (by rank) was last renewed or made, by this machine's clock
        self._renewed: dict[int, float] = {}
        #: the node's words where its claim's last renewal failed (by rank), and the nodes
        #: whose failure ``check`` has said
        self._failing: dict[int, str] = {}
        self._said: set[int] = set()
        #: stale claims taken over while claiming (node name, claim, why): said once, together
        self._taken: list[tuple[str, Seen, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> NodeClaims:
        """Claim every node, rank 0 first.

        Raises:
            ClaimHeld: a node is claimed by a live holder (and ``force`` is off); the nodes
                claimed so far are released.
            NodeError: a node could not be reached (unless ``skip_unreachable``) or the claim
                could not be written.
        """
        try:
            for node in sorted(self.cluster.nodes, key=lambda n: n.rank):
                try:
                    self._claim(node)
                except NodeUnreachable as e:
                    if not self.skip_unreachable:
                        raise
                    self._note(of_node(node.name, e.message, "not claimed"))
                    continue
                self.held.append(node)
                self._renewed[node.rank] = time.time()
            self._say_taken()
        except BaseException:
            self._say_taken()
            self._release_all()
            raise
        self._thread = threading.Thread(target=self._renew_loop, name="claims", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._release_all()

    def _say_taken(self) -> None:
        """Say the stale claims taken over, one line per holder and reason: a kill -9's four
        nodes are one line, not four alike but for their seconds left."""
        groups: dict[tuple[str, str], list[tuple[str, Seen]]] = {}
        for name, seen, why in self._taken:
            holder = seen.holder.describe() if seen.holder is not None else seen.describe()
            groups.setdefault((holder, why), []).append((name, seen))
        self._taken.clear()
        for (holder, why), nodes in groups.items():
            said = nodes[0][1].describe() if len(nodes) == 1 else holder
            names = ", ".join(name for name, _ in nodes)
            self._note(f"{names}: taking over a stale claim ({said}): {why}")

    # ---- taking -----------------------------------------------------------------------------
    def _claim(self, node: NodeSpec) -> None:
        for look in range(_LOOKS + 2):
            seen = self._take(node)
            if seen is None:
                return
            why = seen.stale()
            if seen.holder is None and look < _LOOKS:
                time.sleep(0.1)  # being made right now: its maker writes the id next
                continue
            if why is None and not self.force:
                raise ClaimHeld(
                    f"{node.name} ({node.host}) is claimed by another orchestrator: "
                    f"{seen.describe()}; if that holder is gone, "
                    "`orchestrate cluster down --force` breaks its claim",
                    rank=node.rank,
                    host=node.host,
                    holder=seen.describe(),
                )
            if self.force:
                self._broken(node, seen, why or "broken by --force while live")
            elif why is not None:  # stale (a live claim raised above)
                self._taken.append((node.name, seen, why))
            old = seen.holder.id if seen.holder is not None else ""
            check(
                self._t(node).run(_remove_command(node, old, self.holder.id, "broken"), timeout=30),
                node,
                "breaking a claim",
            )
        raise ClaimHeld(
            f"{node.name} ({node.host}): its claim kept changing hands while this orchestrator "
            "tried to take it; try again",
            rank=node.rank,
            host=node.host,
            holder="?",
        )

    def _take(self, node: NodeSpec) -> Seen | None:
        """Make the claim: None when made, else the claim that is there."""
        argv = _take_command(node, self.holder, self.ttl_s)
        result = self._t(node).run(argv, timeout=30)
        if result.returncode != 0:
            raise _not_taken(node, result)
        if result.stdout.startswith("taken"):
            return None
        seen = _parse_seen(result.stdout)
        if seen.holder is not None and seen.holder.id == self.holder.id:
            return None  # ours already
        return seen

    # ---- keeping ----------------------------------------------------------------------------
    def check(self) -> None:
        """Renew every claim now (a safe point of the round).

        Raises:
            ClaimLost: a node's claim is now another's, or gone.
        """
        if self.lost is None:
            self._renew_all()
        if self.lost is not None:
            raise self.lost
        for node in self.held:
            words = self._failing.get(node.rank)
            if words is not None and node.rank not in self._said:
                self._said.add(node.rank)
                self._note(
                    f"{node.name} ({node.host}): its claim could not be renewed: {words}; the "
                    "node's file system, not the config: it goes on, renewed again once the "
                    "node answers"
                )

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            self._renew_all()
            if self.lost is not None:
                return

    def _renew_all(self) -> None:
        with self._lock:
            for node in self.held:
                if self.lost is not None:
                    return
                argv = _renew_command(node, self.holder, self.ttl_s)
                try:
                    result = self._t(node).run(argv, timeout=30)
                except NodeError:
                    continue  # unreachable for now: renewed when it answers again
                if result.stdout.startswith("held"):
                    seen = _parse_seen(result.stdout)
                    self.lost = ClaimLost(
                        f"{node.name} ({node.host}): this orchestrator lost its claim on the "
                        f"node ({self._found(node, seen)})",
                        rank=node.rank,
                        host=node.host,
                        holder=None if seen.holder is None else seen.describe(),
                    )
                    self.gone.set()  # after ``lost``: whoever stops at it finds why
                elif result.returncode == 0:
                    self._renewed[node.rank] = time.time()
                    self._failing.pop(node.rank, None)
                else:  # the node's file system refused (its words): tried again next time
                    self._failing.setdefault(node.rank, last_words(result))

    def _found(self, node: NodeSpec, seen: Seen) -> str:
        """What a renewal found in place of this holder's claim on ``node``, and when: no
        claim, a claim whose ``id`` another wrote over this holder's ``holder.json``, or
        another holder's."""
        if seen.holder is None:
            found = (
                "no claim is there any more"
                if seen.left_s is None
                else "a claim being made by another (no holder yet)"
            )
        elif same_process(seen.holder, self.holder):
            found = (
                f"its id file now reads {seen.holder.id}, and its holder.json still names "
                f"this {self.holder.what}: another program wrote over it"
            )
        else:
            found = f"it is now claimed by {seen.describe()}"
        renewed = self._renewed.get(node.rank)
        since = "" if renewed is None else f", last renewed at {_utc(renewed)}"
        return f"{found}; found at {_utc(time.time())}{since}"

    def _release_all(self) -> None:
        with self._lock:
            for node in reversed(self.held):
                argv = _remove_command(node, self.holder.id, self.holder.id, "released")
                with contextlib.suppress(NodeError):
                    self._t(node).run(argv, timeout=30)
            self.held = []

    def _t(self, node: NodeSpec) -> Transport:
        return self.transports[node.rank]
