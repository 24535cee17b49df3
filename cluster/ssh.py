"""The SSH transport: paramiko behind the ``Transport`` protocol, one connection per node.

What it promises, and how:
- argv lists only: the command line a node's shell sees is ``shlex.join(argv)``, so every
  token arrives as one word, whatever it contains.
- ``~/.ssh/config`` is honoured the way ``ssh`` honours it (``cluster.ssh_config``); the
  profile's own fields win, as ``ssh``'s command line does.
- Host keys are checked strictly, always: a key pinned in the profile, else the known_hosts
  files. An unknown key or a changed key refuses the connection and the error says how to
  trust it. There is no "accept new keys" mode, on purpose (``cluster.ssh_login`` opens and
  authenticates the connection; this module keeps it and runs commands over it).
- A node that stops answering is noticed within ``io_timeout_s`` (no request waits longer for
  the server), also on a connection that was already open, and is reported as
  ``NodeUnreachable`` (class ``unreachable``, exit 5) with host, port and user.
- A passphrase is read from the environment variable the profile names, handed to paramiko
  and never stored, logged or put in an error.
"""

from __future__ import annotations

import contextlib
import logging
import select
import shlex
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

import paramiko

from cluster.errors import NodeError, NodeUnreachable, tail
from cluster.inventory import NodeSpec, SshOptionsSpec, SshSpec
from cluster.ssh_config import (
    Endpoint,
    read_ssh_config,
    resolve,
)
from cluster.ssh_login import Login, safe_message
from cluster.transport import CommandResult
from knobs.vocabulary import FailureClass

# paramiko logs tracebacks of conditions this module turns into typed errors (a missing banner,
# a reset connection); without a handler Python would print them to stderr. An application
# that configures logging still receives them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

#: Output kept per stream of one command (the tail); a launcher never prints more.
MAX_OUTPUT_BYTES = 4_000_000


@dataclass
class _Watchdog:
    """Closes a connection when an operation outlives its deadline, so that a paramiko wait
    that has no timeout of its own (an exec request's reply) returns."""

    fired: bool = False
    timer: threading.Timer | None = field(default=None, repr=False)


class SshTransport:
    """Commands and files on one node over one reused SSH connection."""

    def __init__(self, node: NodeSpec, options: SshOptionsSpec | None = None) -> None:
        if node.ssh is None:
            raise ValueError(f"{node.name} has no ssh section")
        self.node = node
        self.spec: SshSpec = node.ssh
        self.options = options or SshOptionsSpec()
        self._lock = threading.RLock()
        self._client: paramiko.SSHClient | None = None
        self._jump_clients: list[paramiko.SSHClient] = []
        self._sftp: paramiko.SFTPClient | None = None
        self._endpoint: Endpoint | None = None
        self.connections = 0  # how many times a connection was opened (reuse is observable)
        self._login = Login(node, self.options, lambda message, cls: self._error(message, cls))

    def __repr__(self) -> str:
        return f"SshTransport({self.node.name}, {self.spec.host})"

    # ---- resolution and errors --------------------------------------------------------------
    @property
    def endpoint(self) -> Endpoint:
        """This node's destination after ``~/.ssh/config``.

        Raises:
            NodeUnreachable: the ssh config cannot be read or asks for a ProxyCommand.
        """
        if self._endpoint is None:
            try:
                config = read_ssh_config(self.options.config_file)
                self._endpoint = resolve(
                    self.spec.host,
                    config,
                    user=self.spec.user,
                    port=self.spec.port,
                    key_file=self.spec.key_file,
                    proxy_jump=self.spec.proxy_jump,
                    known_hosts=self.options.known_hosts,
                )
            except NodeUnreachable as e:
                raise self._error(e.message, "unreachable") from e
        return self._endpoint

    def _where(self) -> str:
        try:
            return self.endpoint.where
        except NodeUnreachable:
            return self.spec.host

    def _error(
        self,
        message: str,
        failure_class: FailureClass,
        *,
        command: str | None = None,
        stderr_tail: str = "",
    ) -> NodeError:
        text = f"{self.node.name} ({self._where()}): {message}"
        kind = (
            NodeUnreachable if failure_class in ("unreachable", "auth", "host_key") else NodeError
        )
        return kind(
            text,
            failure_class=failure_class,
            rank=self.node.rank,
            host=self.node.host,
            command=command,
            stderr_tail=stderr_tail,
        )

    # ---- connecting -------------------------------------------------------------------------
    def connect(self) -> None:
        """Open the connection now (a later command reuses it).

        Raises:
            NodeUnreachable: classes unreachable, auth or host_key, saying what to do.
        """
        self._connection()

    def _connection(self) -> paramiko.SSHClient:
        with self._lock:
            client = self._client
            transport = client.get_transport() if client is not None else None
            if client is not None and transport is not None and transport.is_active():
                return client
            self._drop()
            ep = self.endpoint
            jump_client: paramiko.SSHClient | None = None
            for hop in ep.jumps:
                jump_client = self._login.hop(hop, via=jump_client)
                self._jump_clients.append(jump_client)
            self._client = self._login.open(
                ep,
                self.spec.host_key,
                via=jump_client,
                explicit_key=self.spec.key_file,
                passphrase_env=self.spec.passphrase_env,
            )
            self.connections += 1
            return self._client

    def _drop(self) -> None:
        """Forget the connection (and its jump hosts); the next call reconnects."""
        with self._lock:
            sftp, self._sftp = self._sftp, None
            client, self._client = self._client, None
            jumps, self._jump_clients = self._jump_clients, []
        if sftp is not None:
            with contextlib.suppress(Exception):
                sftp.close()
        for c in [client, *reversed(jumps)]:
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()

    @contextlib.contextmanager
    def _watchdog(self, seconds: float) -> Iterator[_Watchdog]:
        dog = _Watchdog()

        def fire() -> None:
            dog.fired = True
            self._drop()

        dog.timer = threading.Timer(seconds, fire)
        dog.timer.daemon = True
        dog.timer.start()
        try:
            yield dog
        finally:
            dog.timer.cancel()

    def _responsive(self) -> bool:
        """Whether the server still answers on our connection (it opens a channel in time)."""
        client = self._client
        transport = client.get_transport() if client is not None else None
        if transport is None or not transport.is_active():
            return False
        try:
            probe = transport.open_session(timeout=self.options.io_timeout_s)
        except (paramiko.SSHException, EOFError, OSError):
            return False
        probe.close()
        return True

    def _silent(self, doing: str, command: str | None = None) -> NodeError:
        """The error for a server that stopped answering; the connection is dropped."""
        self._drop()
        return self._error(
            f"the node stopped answering while {doing} (nothing within "
            f"{self.options.io_timeout_s:g}s; sshd stopped, node hung, or link down)",
            "unreachable",
            command=command,
        )

    # ---- commands ---------------------------------------------------------------------------
    def run(self, argv: Sequence[str], *, timeout: float = 60.0) -> CommandResult:
        """Run ``argv`` on the node (as one ``shlex.join``-ed line) and wait for it.

        Raises:
            NodeUnreachable: cannot connect, or the node stopped answering (classes
                unreachable, auth, host_key).
            NodeError: the command ran past ``timeout`` on a live node (class remote_failed).
            ValueError: ``argv`` is empty or holds a NUL byte.
        """
        args = [str(a) for a in argv]
        if not args or any("\x00" in a for a in args):
            raise ValueError("argv must be a non-empty list of strings without NUL bytes")
        command = shlex.join(args)
        client = self._connection()
        transport = client.get_transport()
        try:
            if transport is None:
                raise EOFError("no transport")
            channel = transport.open_session(timeout=self.options.io_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as e:
            if transport is not None and transport.is_active():
                raise self._silent("opening a channel", command) from e
            # The cached connection had died (reset, node rebooted): one fresh connection.
            self._drop()
            client = self._connection()
            transport = client.get_transport()
            assert transport is not None
            try:
                channel = transport.open_session(timeout=self.options.io_timeout_s)
            except (paramiko.SSHException, EOFError, OSError) as e2:
                raise self._silent("opening a channel", command) from e2
        with channel:
            with self._watchdog(self.options.io_timeout_s) as dog:
                try:
                    channel.exec_command(command)
                except (paramiko.SSHException, EOFError, OSError) as e:
                    if dog.fired:
                        raise self._silent("starting the command", command) from e
                    self._drop()
                    raise self._error(
                        f"the connection dropped while starting the command ({safe_message(e)})",
                        "unreachable",
                        command=command,
                    ) from e
            returncode, out, err = self._collect(channel, command, timeout)
        return CommandResult(
            argv=tuple(args),
            returncode=returncode,
            stdout=out.decode(errors="replace"),
            stderr=err.decode(errors="replace"),
        )

    def _collect(
        self, channel: paramiko.Channel, command: str, timeout: float
    ) -> tuple[int, bytes, bytes]:
        out, err = bytearray(), bytearray()
        started = time.monotonic()
        last_heard = started
        while True:
            heard = False
            while channel.recv_ready():
                out += channel.recv(65536)
                heard = True
            while channel.recv_stderr_ready():
                err += channel.recv_stderr(65536)
                heard = True
            del out[:-MAX_OUTPUT_BYTES], err[:-MAX_OUTPUT_BYTES]
            # paramiko marks the status ready on exit-status and also when the channel closes
            # without one (-1): killed by a signal on a live connection, or the connection died
            if channel.exit_status_ready() and not (
                channel.recv_ready() or channel.recv_stderr_ready()
            ):
                status = channel.recv_exit_status()
                transport = channel.get_transport()
                if status == -1 and (transport is None or not transport.is_active()):
                    self._drop()
                    raise self._error(
                        "the connection dropped while the command ran",
                        "unreachable",
                        command=command,
                        stderr_tail=tail(err.decode(errors="replace"), 15),
                    )
                return status, bytes(out), bytes(err)
            now = time.monotonic()
            if heard:
                last_heard = now
            if now - started > timeout:
                if not self._responsive():
                    raise self._silent("the command ran", command)
                raise self._error(
                    f"the command did not finish within {timeout:g}s",
                    "remote_failed",
                    command=command,
                    stderr_tail=tail(err.decode(errors="replace"), 15),
                )
            if now - last_heard > self.options.alive_interval_s:
                # ServerAliveInterval: a silent command is fine, a silent server is not.
                if not self._responsive():
                    raise self._silent("the command ran", command)
                last_heard = time.monotonic()
            select.select([channel], [], [], 0.05)

    # ---- files ------------------------------------------------------------------------------
    def _sftp_client(self) -> paramiko.SFTPClient:
        with self._lock:
            if self._sftp is not None:
                return self._sftp
        client = self._connection()
        # Starting the SFTP subsystem waits for the server's reply without a timeout of its
        # own: the watchdog bounds it (and the connection lock is not held meanwhile).
        with self._watchdog(self.options.io_timeout_s) as dog:
            try:
                sftp = client.open_sftp()
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise self._silent("opening SFTP") from e
        if dog.fired:
            raise self._silent("opening SFTP")
        # Every SFTP request must be answered within the I/O timeout.
        sftp.get_channel().settimeout(self.options.io_timeout_s)  # type: ignore[union-attr]
        with self._lock:
            if self._sftp is None:
                self._sftp = sftp
            elif self._sftp is not sftp:
                sftp.close()
            return self._sftp

    def _sftp_failed(self, doing: str, path: str, e: BaseException) -> NodeError:
        if isinstance(e, TimeoutError) or not self._responsive():
            return self._silent(f"{doing} {path}")
        if isinstance(e, (paramiko.SSHException, EOFError)):
            self._drop()
            return self._error(
                f"SFTP failed while {doing} {path}: {safe_message(e)}", "unreachable"
            )
        return self._error(f"cannot {doing.split()[0]} {path}: {safe_message(e)}", "upload")

    def put_text(self, path: str, text: str, *, mode: int = 0o644) -> None:
        """Upload ``text`` to ``path`` over SFTP: parents created, written to a temporary name,
        given ``mode``, renamed into place (a reader never sees half a launcher).

        Raises:
            NodeUnreachable: the node cannot be reached or stopped answering.
            NodeError: the file cannot be written (class upload).
        """
        sftp = self._sftp_client()
        target = PurePosixPath(path)
        tmp = f"{target}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            self._makedirs(sftp, target.parent)
            with sftp.open(tmp, "w") as f:
                f.write(text.encode())
            sftp.chmod(tmp, mode)
            sftp.posix_rename(tmp, str(target))
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._sftp_failed("writing", path, e) from e

    @staticmethod
    def _makedirs(sftp: paramiko.SFTPClient, directory: PurePosixPath) -> None:
        missing: list[PurePosixPath] = []
        current = directory
        while str(current) not in ("", ".", "/"):
            try:
                if not stat.S_ISDIR(sftp.stat(str(current)).st_mode or 0):
                    raise NotADirectoryError(f"{current} is not a directory")
                break
            except FileNotFoundError:
                missing.append(current)
                current = current.parent
        for d in reversed(missing):
            sftp.mkdir(str(d))

    def read_text(self, path: str, *, max_bytes: int = 1_000_000) -> str:
        """The last ``max_bytes`` of ``path`` on the node (SFTP), '' if it does not exist.

        Raises:
            NodeUnreachable: the node cannot be reached or stopped answering.
            NodeError: the file exists but cannot be read (class upload).
        """
        sftp = self._sftp_client()
        try:
            size = sftp.stat(path).st_size or 0
            if size == 0:
                return ""
            with sftp.open(path, "rb") as f:
                f.seek(max(0, size - max_bytes))
                data = f.read(min(size, max_bytes))
        except FileNotFoundError:
            return ""
        except (OSError, paramiko.SSHException, EOFError) as e:
            raise self._sftp_failed("reading", path, e) from e
        return bytes(data).decode(errors="replace")

    def close(self) -> None:
        """Close the connection (and any jump hosts)."""
        self._drop()
