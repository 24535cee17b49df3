"""A command line that cannot run as written: one ``Error:`` line and exit code 2, for every
command; Ctrl-C: one line and exit code 130. Never a traceback."""

from __future__ import annotations

import pytest
from typer.main import get_command

from orchestrator.cli import app, run
from tests.test_cli_help import walk

#: ``twin serve`` is ``vllm serve``'s double: it takes vLLM's flags and refuses as vLLM's argparse
#: does (exit 2 with its usage), which is what a twin launcher's log should show.
COMMANDS = [
    " ".join(path)
    for path, command in walk(get_command(app))
    if path and not hasattr(command, "commands") and path != ("twin", "serve")
]


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one line ``orchestrate argv`` says on stderr (asserting exit 2 and nothing else)."""
    code = run(argv)
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, (argv, code, err)
    assert len(lines) == 1 and lines[0].startswith("Error: "), (argv, err)
    assert "Traceback" not in err and out == ""
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_option_is_one_line_and_exit_2(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(capsys, [*command.split(), "--no-such-option"])
    assert "--no-such-option" in line and f"orchestrate {command} --help" in line


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["round", "--budget", "0"], "--budget"),
        (["round", "--budget", "abc"], "'--budget' / '-n': Input should be a valid integer"),
        (["round", "--max-hours", "-1"], "--max-hours"),
        # kept with the round, a cap of 0 would stop every resume before an experiment
        (["round", "--max-hours", "0"], "--max-hours 0 would stop the round before any"),
        (["round", "--max-gpu-hours", "0"], "--max-gpu-hours 0 would stop the round"),
        # past what the ledger's integers hold: one line, not an OverflowError's traceback
        (["round", "--budget", "99999999999999999999"], "less than or equal to 10000"),
        (["round", "--seed", "99999999999999999999"], "--seed"),
        (["experiments", "show", "99999999999999999999"], "less than or equal to 9223372036"),
        (["proposals", "approve", "99999999999999999999"], "less than or equal to 9223372036"),
        (["frobnicate"], "No such command 'frobnicate'"),
        (["proposals", "veto", "1"], "--reason"),
        (["proposals", "approve", "one"], "'proposal_id': Input should be a valid integer"),
    ],
)
def test_a_bad_value_or_command_names_what_was_wrong(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert says in refused(capsys, argv)


def test_orchestrate_alone_shows_what_it_can_do_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run([]) == 2
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    for command in ("round", "status", "export", "proposals", "cluster", "engines"):
        assert command in out
