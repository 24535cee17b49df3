"""Running a Typer app the way every ``orchestrate`` entry point does: errors as one
``Error: …`` line on stderr and an exit code, never a traceback."""

from __future__ import annotations

import click
import typer

from orchestrator.errors import OrchestrateError


def run_app(app: typer.Typer, argv: list[str] | None, prog_name: str) -> int:
    """Run ``app`` on ``argv``; the exit code (a command's ``typer.Exit(n)`` included)."""
    try:
        # with standalone_mode off, click returns a `typer.Exit` code instead of raising it
        code = app(args=argv, standalone_mode=False, prog_name=prog_name)
    except OrchestrateError as e:
        typer.echo(f"Error: {e.message}", err=True)
        return e.exit_code
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show()
        return 2 if isinstance(e, click.UsageError) else e.exit_code
    except (KeyboardInterrupt, click.exceptions.Abort):
        typer.echo("Error: interrupted; run the same command again to resume", err=True)
        return 130
    return code if isinstance(code, int) else 0
