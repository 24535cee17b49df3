"""The round loop, verdicts, champions, budgets, the veto gate, leases, profiles and the CLI."""
