"""A command line that cannot run as written: one ``Error:`` line and exit code 2, for every
command; Ctrl-C: one line and exit code 130. Never a traceback."""

from __future__ import annotations

import shutil
from pathlib import Path

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
        # no "Missing option '--reason'.; see": one stop, then where help is
        (["proposals", "veto", "1"], "Missing option '--reason'; see 'orchestrate proposals"),
        # a veto's reason is shown to every proposer: words (as experiments veto's must be)
        (["proposals", "veto", "1", "--reason", " "], "it must say why the proposal is vetoed"),
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


@pytest.mark.parametrize(
    "argv",
    [
        ["experiments", "show", "-1"],
        ["experiments", "veto", "-1", "--reason", "why"],
        ["known-bad", "clear", "-1", "--reason", "why"],
        ["proposals", "approve", "-1"],
        ["proposals", "veto", "-1", "--reason", "why"],
    ],
)
def test_a_negative_id_is_a_bad_value_not_an_unknown_option(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """click reads ``-1`` as an option: the line said "No such option: -1"."""
    line = refused(capsys, argv)
    assert "No such option" not in line, line
    assert line.startswith("Error: Invalid value for '") and "': -1 (it must be 1 or more)" in line
    # a command that takes no ID still says there is no such option
    assert "No such option: -1" in refused(capsys, ["status", "-1"])


def test_an_id_the_ledger_lacks_is_a_bad_value_exit_3_in_every_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An ID a command names that the ledger does not have (or a proposal decided already) is
    a bad value, exit 3, whichever command: ``report`` and ``proposals`` said 4, the ledger's
    code, as if the ledger had failed; ``experiments`` and ``known-bad`` said 3."""
    ledgers = Path(__file__).parent / "fixtures" / "ledgers"
    shutil.copyfile(ledgers / "schema4.sqlite", tmp_path / "orchestrate.db")
    monkeypatch.setenv("ORCHESTRATE_LEDGER", f"sqlite:///{tmp_path}/orchestrate.db")
    monkeypatch.chdir(tmp_path)
    profile = str(ledgers / "schema4.profile.yaml")
    for argv, says in [
        (["experiments", "show", "999"], "has no experiment #999"),
        (["experiments", "veto", "999", "--reason", "why"], "has no experiment #999"),
        (["known-bad", "clear", "999", "--reason", "why"], "experiment #999 bars nothing"),
        (["proposals", "show", "999"], "no proposal 999 in ledger"),
        (["proposals", "approve", "999"], "no proposal 999 in ledger"),
        (["proposals", "veto", "999", "--reason", "why"], "no proposal 999 in ledger"),
        (["proposals", "approve", "1"], "proposal 1 is already approved"),
        (["report", "--round", "999"], "has no round 999"),
    ]:
        code = run([*argv, "--profile", profile])
        _out, err = capsys.readouterr()
        errors = [line for line in err.splitlines() if line.startswith("Error:")]
        assert (code, len(errors)) == (3, 1), (argv, code, err)
        assert says in errors[0], (argv, errors)
    assert not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    ("argv", "env", "code", "says"),
    [
        # a directory is not "no such file"
        (["status", "-p", "{tmp}"], {}, 3, "profile {tmp}: a directory, not a profile file;"),
        # libpq's spelling, which SQLAlchemy does not know: the driver orchestrate installs
        (
            ["status"],
            {"ORCHESTRATE_LEDGER": "postgres://u:pw@127.0.0.1/db"},
            4,
            "SQLAlchemy does not know postgres://; write postgresql+psycopg://…",
        ),
    ],
)
def test_a_bad_profile_path_or_ledger_url_says_what_to_write(
    argv: list[str],
    env: dict[str, str],
    code: int,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert run([a.format(tmp=tmp_path) for a in argv]) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says.format(tmp=tmp_path) in lines[0], lines
    assert "Can't load plugin" not in lines[0]
