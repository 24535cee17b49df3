"""The SSH transport: paramiko behind the ``Transport`` protocol, one connection per node.

What it promises, and how:
- argv lists only: the command line a node's shell sees is ``shlex.join(argv)``, so every
  token arrives as one word, whatever it contains.
- ``~/.ssh/config`` is honoured the way ``ssh`` honours it (``cluster.ssh_config``); the
  profile's own fields win, as ``ssh``'s command line does.
- Host keys are checked strictly, always: a key pinned in the profile, else the known_hosts
  files. An unknown key or a changed key refuses the connection and the error says how to
  trust it. There is no "accept new keys" mode, on purpose.
- A node that stops answering is noticed within ``io_timeout_s`` (no request waits longer for
  the server), also on a connection that was already open, and is reported as
  ``NodeUnreachable`` (class ``unreachable``, exit 5) with host, port and user.
- A passphrase is read from the environment variable the profile names, handed to paramiko
  and never stored, logged or put in an error.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import shlex
import socket
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import paramiko

from cluster.errors import NodeError, NodeUnreachable, tail
from cluster.inventory import NodeSpec, SshOptionsSpec, SshSpec
from cluster.ssh_config import (
    SSH_PORT,
    Endpoint,
    UnknownHostKey,
    expand_path,
    read_ssh_config,
    resolve,
    split_hop,
    strict_client,
)
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
                jump_client = self._connect_hop(hop, via=jump_client)
            self._client = self._open(
                ep,
                self.spec.host_key,
                via=jump_client,
                explicit_key=self.spec.key_file,
                passphrase_env=self.spec.passphrase_env,
            )
            self.connections += 1
            return self._client

    def _connect_hop(self, hop: str, via: paramiko.SSHClient | None) -> paramiko.SSHClient:
        """A jump host, resolved through the same ssh config, trusted the same way."""
        user, host, port = split_hop(hop)
        try:
            ep = resolve(
                host,
                read_ssh_config(self.options.config_file),
                user=user,
                port=port,
                known_hosts=self.options.known_hosts,
                proxy_jump="none",
            )
        except NodeUnreachable as e:
            raise self._error(f"jump host {hop}: {e.message}", "unreachable") from e
        client = self._open(ep, None, via=via, what=f"jump host {ep.where}")
        self._jump_clients.append(client)
        return client

    def _socket(self, ep: Endpoint, via: paramiko.SSHClient | None, what: str) -> Any:
        timeout = self.options.connect_timeout_s
        if via is not None:
            transport = via.get_transport()
            assert transport is not None
            try:
                return transport.open_channel(
                    "direct-tcpip", (ep.hostname, ep.port), ("127.0.0.1", 0), timeout=timeout
                )
            except (paramiko.SSHException, EOFError, OSError) as e:
                raise self._error(
                    f"{what}: the jump host could not reach {ep.hostname}:{ep.port} ({e})",
                    "unreachable",
                ) from e
        try:
            sock = socket.create_connection((ep.hostname, ep.port), timeout=timeout)
            # Requests and replies here are small packets in lockstep: with Nagle's algorithm
            # each would wait for the peer's delayed ACK (~40 ms per command). ssh does this too.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except ConnectionRefusedError as e:
            raise self._error(
                f"{what}: connection refused on port {ep.port}: no sshd listening "
                "(is sshd running on the node? is the port right?)",
                "unreachable",
            ) from e
        except TimeoutError as e:
            raise self._error(
                f"{what}: no answer within {timeout:g}s (node down, or the network path to it "
                "is cut)",
                "unreachable",
            ) from e
        except socket.gaierror as e:
            raise self._error(
                f"{what}: cannot resolve {ep.hostname!r}: {e.strerror}", "unreachable"
            ) from e
        except OSError as e:
            raise self._error(f"{what}: {e.strerror or e}", "unreachable") from e

    def _open(
        self,
        ep: Endpoint,
        pinned: str | None,
        *,
        via: paramiko.SSHClient | None,
        what: str = "connect",
        explicit_key: str | None = None,
        passphrase_env: str | None = None,
    ) -> paramiko.SSHClient:
        """One authenticated connection to ``ep`` (directly or through ``via``)."""
        sock = self._socket(ep, via, what)
        client = strict_client(ep, pinned)
        # Read at the moment of use and handed straight to paramiko: never kept, never shown.
        passphrase = os.environ.get(passphrase_env) if passphrase_env else None
        if explicit_key and not os.path.isfile(expand_path(explicit_key)):
            sock.close()
            raise self._error(
                f"{what}: key_file {explicit_key} does not exist on this machine", "auth"
            )
        keys = [k for k in ep.key_files if os.path.isfile(k)]
        self._handshake(client, sock, ep, keys, passphrase, what)
        transport = client.get_transport()
        assert transport is not None
        # Keepalives keep NAT and firewall state alive through a 20-minute boot during which
        # the connection carries nothing (readiness is polled over HTTP).
        transport.set_keepalive(max(1, int(self.options.alive_interval_s)))
        return client

    def _handshake(
        self,
        client: paramiko.SSHClient,
        sock: Any,
        ep: Endpoint,
        keys: list[str],
        passphrase: str | None,
        what: str,
    ) -> None:
        """Key exchange, host-key check and authentication of ``client`` over ``sock``.

        Raises:
            NodeUnreachable: classes host_key, auth or unreachable, saying what to do (the
                client is closed).
        """
        o = self.options
        # With HostKeyAlias the key is filed under the alias without a port (as OpenSSH
        # does); paramiko appends [..]:port for any port but 22, and we pass our own socket,
        # so the name and port given here serve only the host-key lookup.
        lookup_host = ep.host_key_alias or ep.hostname
        lookup_port = SSH_PORT if ep.host_key_alias else ep.port
        try:
            client.connect(
                hostname=lookup_host,
                port=lookup_port,
                username=ep.user,
                sock=sock,
                # Key exchange must finish within the connect timeout: a node whose TCP
                # stack answers but whose sshd cannot complete a handshake is not usable.
                timeout=o.connect_timeout_s,
                # A stopped (SIGSTOP) or wedged sshd accepts TCP but never sends a banner;
                # without this bound paramiko would wait its default 15 s per attempt.
                banner_timeout=o.banner_timeout_s,
                # Bounds the whole authentication (agent round trips included).
                auth_timeout=o.auth_timeout_s,
                # Bounds every channel open on this connection: a live server answers a
                # channel open at once; one that does not is unreachable.
                channel_timeout=o.io_timeout_s,
                key_filename=keys or None,  # type: ignore[arg-type]  # paramiko takes a list
                # ssh-agent holds keys a person has unlocked; offering them is what `ssh`
                # does and keeps passphrases out of orchestrate altogether.
                allow_agent=o.allow_agent,
                # With explicit keys (profile key_file or IdentityFile) try only those (plus
                # the agent): trying every ~/.ssh/id_* burns the server's MaxAuthTries.
                look_for_keys=not keys,
                passphrase=passphrase,
                # Compression costs CPU for the few kilobytes a deploy moves.
                compress=False,
            )
        except (paramiko.BadHostKeyException, UnknownHostKey) as e:
            client.close()
            raise self._host_key_error(e, ep, what) from None
        except (paramiko.SSHException, EOFError, OSError) as e:
            raise self._login_error(e, client, ep, keys, what) from None

    def _host_key_error(
        self, e: paramiko.BadHostKeyException | UnknownHostKey, ep: Endpoint, what: str
    ) -> NodeError:
        """The error for a host key that changed or that no trusted file holds (class host_key)."""
        if isinstance(e, paramiko.BadHostKeyException):
            return self._error(
                f"{what}: host key CHANGED for {ep.known_hosts_name}: the node presented "
                f"{e.key.get_name()} {e.key.fingerprint}, we trust {e.expected_key.fingerprint}. "
                "Someone may be intercepting the connection, or the node was reinstalled. "
                "Verify the new key out of band, then replace the old entry "
                f"(ssh-keygen -R {shlex.quote(ep.known_hosts_name)}; "
                f"{ep.keyscan()} >> ~/.ssh/known_hosts) or update the profile's "
                f"cluster.nodes[rank {self.node.rank}].ssh.host_key",
                "host_key",
            )
        return self._error(
            f"{what}: unknown host key for {e.name}: the node presented "
            f"{e.key.get_name()} {e.key.fingerprint}, which no trusted file holds "
            f"({', '.join(ep.known_hosts) or 'no known_hosts'}). Verify it out of band "
            f"(on the node: ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), then trust it: "
            f"{ep.keyscan()} >> ~/.ssh/known_hosts (check with ssh-keygen -F "
            f"{shlex.quote(ep.known_hosts_name)}), or pin it in the profile as "
            f"cluster.nodes[rank {self.node.rank}].ssh.host_key: "
            f"'{e.key.get_name()} {e.key.get_base64()}'",
            "host_key",
        )

    def _login_error(
        self,
        e: paramiko.SSHException | EOFError | OSError,
        client: paramiko.SSHClient,
        ep: Endpoint,
        keys: list[str],
        what: str,
    ) -> NodeError:
        """The error for a failed authentication or handshake (class auth or unreachable).

        Closes ``client`` (after reading whether its key exchange finished).
        """
        o = self.options
        if isinstance(e, paramiko.PasswordRequiredException):
            client.close()
            return self._error(
                f"{what}: the key {', '.join(keys)} is encrypted and no passphrase was given: "
                "load it into ssh-agent (ssh-add), or name an environment variable holding "
                "the passphrase in the node's ssh.passphrase_env",
                "auth",
            )
        if isinstance(e, paramiko.AuthenticationException):
            client.close()
            tried = ", ".join(keys) or "the default ~/.ssh/id_* keys"
            agent = " and ssh-agent's keys" if o.allow_agent else ""
            return self._error(
                f"{what}: authentication as {ep.user!r} failed ({type(e).__name__}); tried "
                f"{tried}{agent}. Check the user, the key, and that its public half is in "
                f"~{ep.user}/.ssh/authorized_keys on the node",
                "auth",
            )
        if isinstance(e, paramiko.SSHException):
            transport = client.get_transport()
            client.close()
            # After the key exchange (the server's key is known and was accepted) the only
            # step left is authentication: a key that cannot be decrypted or is refused.
            if transport is not None and transport.host_key is not None:
                return self._error(
                    f"{what}: authentication as {ep.user!r} failed: {_safe(e)}", "auth"
                )
            return self._error(
                f"{what}: no SSH handshake within {o.banner_timeout_s:g}s ({_safe(e)}): "
                "sshd is hung, stopped or overloaded",
                "unreachable",
            )
        client.close()
        return self._error(
            f"{what}: the connection dropped during the handshake ({_safe(e)})", "unreachable"
        )

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
                        f"the connection dropped while starting the command ({_safe(e)})",
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
            return self._error(f"SFTP failed while {doing} {path}: {_safe(e)}", "unreachable")
        return self._error(f"cannot {doing.split()[0]} {path}: {_safe(e)}", "upload")

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


def _safe(e: BaseException) -> str:
    """An exception's text, one line, for an error message (never a secret: paramiko's
    exceptions do not carry passphrases, and ours are built without them)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:300]
