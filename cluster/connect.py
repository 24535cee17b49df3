"""The transport each node of a cluster uses: local or SSH, as its spec asks (issue #4).

Imports both transports' modules, so neither imports the other; ``cluster.ssh`` (and paramiko
with it) loads only for a cluster that has an SSH node.
"""

from __future__ import annotations

from cluster.inventory import NodeSpec, SshOptionsSpec
from cluster.transport import LocalTransport, Transport


def open_transport(node: NodeSpec, ssh: SshOptionsSpec | None = None) -> Transport:
    """The transport a node's spec asks for; ``ssh`` is the cluster's SSH settings (issue #4).

    Nothing is connected yet: an SSH connection opens on first use and is reused after.
    """
    if node.transport == "local":
        return LocalTransport(node)
    from cluster.ssh import SshTransport  # paramiko loads only for clusters that use it

    return SshTransport(node, ssh)
