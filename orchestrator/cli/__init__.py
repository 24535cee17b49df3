"""The ``orchestrate`` command line, one module per noun (``round``, ``status``, ``export``,
``proposals``, ``known_bad``, ``cluster``, ``bench``, ``twin``; ``engines`` is
``orchestrator.engines.cli``), joined in ``root``. With ``orchestrator.exits``, the only place
that turns an error into an exit code."""

from orchestrator.cli.root import app, main, run

__all__ = ["app", "main", "run"]
