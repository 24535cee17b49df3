"""Nodes, transports, launchers, deploy and teardown, bench cells, and the digital twin engine."""
