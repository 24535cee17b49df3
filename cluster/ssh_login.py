"""Opening one authenticated SSH connection: the socket (direct or through a jump host), the
key exchange, the strict host-key check and the authentication, and the one-line error that
says what to do when one of them fails. ``SshTransport`` (``cluster.ssh``) keeps the
connection and runs commands over it.

- Host keys are checked strictly, always: a key pinned in the profile, else the known_hosts
  files. An unknown or a changed key refuses the connection and the error says how to trust it.
- A passphrase is read from the environment variable the profile names at the moment of use,
  handed to paramiko and never stored, logged or put in an error.
"""

from __future__ import annotations

import os
import shlex
import socket
from collections.abc import Callable
from typing import Any

import paramiko

from cluster.errors import NodeError, NodeUnreachable
from cluster.inventory import NodeSpec, SshOptionsSpec
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
from knobs.spec import clipped
from knobs.vocabulary import FailureClass


class Login:
    """Opens authenticated connections for one node, its jump hosts included."""

    def __init__(
        self,
        node: NodeSpec,
        options: SshOptionsSpec,
        error: Callable[[str, FailureClass], NodeError],
    ) -> None:
        self.node = node
        self.options = options
        #: the node's error for a message and class (``SshTransport``'s: names the node)
        self._error = error

    def hop(self, hop: str, via: paramiko.SSHClient | None) -> paramiko.SSHClient:
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
        return self.open(ep, None, via=via, what=f"jump host {ep.where}")

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

    def open(
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
                    f"{what}: authentication as {ep.user!r} failed: {safe_message(e)}", "auth"
                )
            return self._error(
                f"{what}: no SSH handshake within {o.banner_timeout_s:g}s ({safe_message(e)}): "
                "sshd is hung, stopped or overloaded",
                "unreachable",
            )
        client.close()
        return self._error(
            f"{what}: the connection dropped during the handshake ({safe_message(e)})",
            "unreachable",
        )


def safe_message(e: BaseException) -> str:
    """An exception's text, one line, for an error message (never a secret: paramiko's
    exceptions do not carry passphrases, and ours are built without them)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return clipped(text, 300)
