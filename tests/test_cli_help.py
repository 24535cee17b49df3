"""The README's "Using it" section documents every command and option of ``orchestrate``.

In the spirit of sqlite-utils' documentation tests: the command tree is walked as ``--help``
shows it (every group and sub-command, ``engines`` and ``twin`` included) and each command
path (``orchestrate proposals veto``) and each option name, long and short (``--reason``,
``-p``), has to appear in that section. A new command or option fails here, naming what the
README lacks.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup
from typer.main import get_command

from orchestrator.cli import app, run

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Using it"


def usage_section(readme: str) -> str:
    """The README's "Using it" section: from its heading to the next ``## `` heading."""
    start = readme.find(f"\n{SECTION}\n")
    assert start >= 0, f"README.md has no {SECTION!r} section"
    end = readme.find("\n## ", start + 1)
    return readme[start : None if end < 0 else end]


def walk(command: object, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], object]]:
    """Every command under ``command`` (itself first) with its path of names."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            if not getattr(sub, "hidden", False):
                yield from walk(sub, (*path, name))


def option_names(command: object) -> list[str]:
    """The option names ``--help`` shows for ``command`` (``--help`` itself aside)."""
    names: list[str] = []
    for param in getattr(command, "params", []):
        if param.param_type_name == "option" and not getattr(param, "hidden", False):
            names += [*param.opts, *param.secondary_opts]
    return names


def _mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def missing_from(text: str, cli: typer.Typer) -> list[str]:
    """What of ``cli``'s command tree ``text`` does not mention: ``orchestrate PATH`` for a
    command, ``orchestrate PATH --option`` for an option."""
    missing = []
    for path, command in walk(get_command(cli)):
        name = " ".join(("orchestrate", *path))
        if not _mentions(text, name):
            missing.append(name)
        missing += [f"{name} {opt}" for opt in option_names(command) if not _mentions(text, opt)]
    return missing


def test_every_command_and_option_is_in_the_readme() -> None:
    assert missing_from(usage_section(README.read_text()), app) == []


def test_the_walk_reaches_every_group_and_sub_command() -> None:
    paths = {" ".join(path) for path, _ in walk(get_command(app))}
    assert {
        "round",
        "proposals veto",
        "cluster up",
        "twin serve",
        "twin optimum",
        "engines install",
        "engines status",
    } <= paths
    options = {opt for _, command in walk(get_command(app)) for opt in option_names(command)}
    assert {"--budget", "-n", "--profile", "-p", "--reason", "--set", "--root"} <= options


def test_a_missing_command_or_option_is_named() -> None:
    section = usage_section(README.read_text())
    cut = section.replace("--force", "").replace("orchestrate cluster down", "")
    assert set(missing_from(cut, app)) == {
        "orchestrate engines install --force",
        "orchestrate cluster up --force",
        "orchestrate init --force",
        "orchestrate cluster down",
        "orchestrate cluster down --force",
    }
    # a longer word is not a mention: `--root` is not in `--rooted`, `-n` not in `-nx`
    assert not _mentions("[--rooted DIR] -nx", "--root")
    assert not _mentions("[--rooted DIR] -nx", "-n")


def test_every_help_text_reads_as_prose_without_markup_or_source_line_breaks(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A docstring's line breaks are where its source wrapped, not where a sentence ends:
    ``--help`` shows each paragraph as one line the terminal wraps, with no reST ``code``
    (typer's rich help would keep both), for every command and group."""
    for path, command in walk(get_command(app)):
        text = getattr(command, "help", None) or ""
        where = " ".join(("orchestrate", *path))
        assert "``" not in text, where
        for paragraph in text.split("\n\n"):
            assert "\n" not in paragraph.strip(), (where, paragraph)
    monkeypatch.setenv("COLUMNS", "300")
    assert run(["--help"]) == 0
    shown = capsys.readouterr().out
    assert "or add them to an Optuna study (with --optuna-storage): one trial each" in shown
    assert "GPU-hours went, the champion's launcher diff" in shown
    assert "become placeholders. The profile is rendered back" in shown


def test_a_number_range_in_help_is_never_folded_mid_number(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On an 80-column terminal every option's or argument's range (``--seed``'s, an ID's)
    shows on one line of its ``--help``: an ID's upper bound, the ledger's 2**63 - 1, was shown
    as ``[0<=x<=92233720368547758`` on one line and ``07]`` on the next."""
    monkeypatch.setenv("COLUMNS", "80")
    checked = []
    for path, command in walk(get_command(app)):
        for param in getattr(command, "params", []):
            shown = getattr(param, "_get_number_range_help_str", lambda: None)()
            if shown is None:
                continue
            assert run([*path, "--help"]) == 0
            lines = capsys.readouterr().out.splitlines()
            where = " ".join(("orchestrate", *path, param.name))
            assert any(f"[{shown}]" in line for line in lines), (where, shown)
            checked.append(where)
    assert "orchestrate round seed" in checked and "orchestrate proposals approve proposal_id" in (
        checked
    )


def test_export_help_says_a_directory_is_taken_and_must_exist(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "300")
    assert run(["export", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "orchestrate export [OPTIONS] [PATH]" in shown
    assert "to PATH (a file, or into a directory that exists)" in shown
    assert "a directory, which must exist, to write its results.tsv" in shown
