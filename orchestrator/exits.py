"""Running a Typer app the way every ``orchestrate`` entry point does: errors as one
``Error: …`` line on stderr and an exit code, never a traceback.

Typer carries its own copy of click (``typer._click``, since typer 0.22): its exceptions are
caught here through typer's public ``TyperException``, ``Exit`` and ``Abort``, never through
the separate ``click`` package, whose classes typer no longer raises.
"""

from __future__ import annotations

import re

import typer

# typer's own click (pinned in pyproject.toml): the one refusal that is not an error line
from typer._click.exceptions import NoArgsIsHelpError, NoSuchOption

from orchestrator.errors import INTERRUPTED, OrchestrateError
from orchestrator.interrupts import ended_like_ctrl_c

#: The exit code of a command line that cannot be run as written (click's, and the README's).
USAGE = 2


def run_app(app: typer.Typer, argv: list[str] | None, prog_name: str) -> int:
    """Run ``app`` on ``argv``; the exit code (a command's ``typer.Exit(n)`` included)."""
    try:
        # with standalone_mode off, click returns a `typer.Exit` code instead of raising it
        with ended_like_ctrl_c():
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
    message = _negative_id(e) or " ".join(e.format_message().split()).rstrip(".")
    typer.echo(f"Error: {message}{where}", err=True)
    return USAGE


def _negative_id(e: typer.TyperException) -> str | None:
    """What a negative number given for a command's ID means (``experiments show -1``): click
    reads ``-1`` as an option, and said "No such option: -1". ``None`` for any other refusal,
    and where the command takes no ID (a number with a floor) to be given it."""
    if not isinstance(e, NoSuchOption) or not re.fullmatch(r"-\d+", e.option_name):
        return None
    ctx = e.ctx
    floors = [
        (str(p.name), floor)
        for p in (ctx.command.params if ctx is not None else [])
        if p.param_type_name == "argument" and isinstance(floor := getattr(p, "min", None), int)
    ]
    if not floors:
        return None
    name, floor = floors[0]
    return f"Invalid value for '{name}': {e.option_name} (it must be {floor} or more)"
