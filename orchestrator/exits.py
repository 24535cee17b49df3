"""Running a Typer app the way every ``orchestrate`` entry point does: errors as one
``Error: …`` line on stderr and an exit code, never a traceback.

Typer carries its own copy of click (``typer._click``, since typer 0.22): its exceptions are
caught here through typer's public ``TyperException``, ``Exit`` and ``Abort``, never through
the separate ``click`` package, whose classes typer no longer raises.
"""

from __future__ import annotations

import typer

# typer's own click (pinned in pyproject.toml): the one refusal that is not an error line
from typer._click.exceptions import NoArgsIsHelpError

from orchestrator.errors import OrchestrateError

#: The exit code of a command line that cannot be run as written (click's, and the README's).
USAGE = 2
#: The exit code of an interrupted command (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def run_app(app: typer.Typer, argv: list[str] | None, prog_name: str) -> int:
    """Run ``app`` on ``argv``; the exit code (a command's ``typer.Exit(n)`` included)."""
    try:
        # with standalone_mode off, click returns a `typer.Exit` code instead of raising it
        code = app(args=argv, standalone_mode=False, prog_name=prog_name)
    except OrchestrateError as e:
        typer.echo(f"Error: {e.message}", err=True)
        return e.exit_code
    except typer.Exit as e:
        return e.exit_code
    except typer.TyperException as e:
        return _refused(e)
    except (KeyboardInterrupt, typer.Abort):
        code = INTERRUPTED
    if code == INTERRUPTED:
        # typer turns Ctrl-C into a silent exit code 130 (no command of ours exits so)
        typer.echo("Error: interrupted; run the same command again to resume", err=True)
    return code if isinstance(code, int) else 0


def _refused(e: typer.TyperException) -> int:
    """A command line typer refused: one ``Error:`` line naming where help is, and exit code 2
    for a usage error (a command given nothing to do has had its help shown by typer)."""
    if e.exit_code != USAGE:
        typer.echo(f"Error: {e.format_message()}", err=True)
        return e.exit_code
    if isinstance(e, NoArgsIsHelpError):
        return USAGE
    ctx = getattr(e, "ctx", None)
    where = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
    message = " ".join(e.format_message().split())
    typer.echo(f"Error: {message}{where}", err=True)
    return USAGE
