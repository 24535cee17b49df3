"""The round loop, verdicts, champions, budgets, the veto gate, leases, profiles and the CLI.

Every package imports ``orchestrator.errors`` (the error root), which loads this file first:
keep it free of imports.
"""
