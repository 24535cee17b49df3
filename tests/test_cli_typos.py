"""A value misspelt on the command line (``--set``'s knob or value, ``round --approve`` and
``--proposer``): one line naming the value, the option it came in, what it is a typo of
(``knobs.names``, the policy a profile's misspelt key follows) and the values there are; the
command's usual exit code for it; nothing written to the ledger, which is not even created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from knobs.names import did_you_mean
from tests.fixtures.cli import orchestrate


def test_a_short_words_slip_and_a_prefix_are_typos_as_a_long_names_near_miss_is() -> None:
    """A slip in a three-letter word drops ``difflib``'s ratio far below a long name's cutoff:
    one edit away (a letter wrong, missing, extra, two swapped) counts too; a prefix names every
    value it begins; a word one edit from nothing, or known already, or a number, is no typo."""
    assert did_you_mean("aks", ["auto", "ask", "queue"]) == "did you mean ask?"
    assert did_you_mean("optuan", ["optuna", "sweep", "claude"]) == "did you mean optuna?"
    assert did_you_mean("hybird", ["optuna", "hybrid"]) == "did you mean hybrid?"
    assert did_you_mean("fp8", ["auto", "fp8_e4m3", "fp8_e5m2"]) == (
        "did you mean fp8_e4m3 or fp8_e5m2?"
    )
    long = "num_speculative_tokens"
    assert did_you_mean("num_speculative_tokns", [long]) == f"did you mean {long}?"
    assert did_you_mean("speed", ["sweep", "optuna"]) is None
    assert did_you_mean("ask", ["auto", "ask"]) is None
    assert did_you_mean("6", ["0", "16", "64"]) is None  # another number, not a typo of one


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "ORCHESTRATE_LEDGER": f"sqlite:///{tmp_path / 'orchestrate.db'}"}


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--approve", "aks"],
            "Error: --approve 'aks' is not one of auto, ask, queue; did you mean ask?",
        ),
        (
            ["--proposer", "optuan"],
            "Error: --proposer 'optuan' is not one of optuna, sweep, claude, hybrid; did you "
            "mean optuna?",
        ),
    ],
)
def test_a_misspelt_approval_mode_or_proposer_names_the_one_meant(
    tmp_path: Path, argv: list[str], line: str
) -> None:
    done = orchestrate(tmp_path, "round", *argv, env=_env(tmp_path), timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [line]
    assert not (tmp_path / "orchestrate.db").exists()  # refused before the ledger opened


def test_set_of_a_misspelt_knob_or_value_names_the_item_and_what_it_is_a_typo_of(
    tmp_path: Path,
) -> None:
    """``cluster up`` (not a dry run: it records the profile in the ledger as it opens it)
    refuses the item first: a knob name's typo, and a choice knob's value's, each naming the
    ``--set`` item and the value(s) meant."""
    env = _env(tmp_path)
    done = orchestrate(tmp_path, "cluster", "up", "--set", "num_speculative_tokns=3", env=env)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(
        "Error: --set num_speculative_tokns=3: unknown knob 'num_speculative_tokns'; did you "
        "mean num_speculative_tokens? (known knobs: "
    ), line
    done = orchestrate(
        tmp_path,
        "cluster",
        "up",
        "--set",
        "num_speculative_tokens=3",
        "--set",
        "kv_cache_dtype=fp8_e4m",
        env=env,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "Error: --set kv_cache_dtype=fp8_e4m: knob kv_cache_dtype: 'fp8_e4m' is not one of "
        "auto, fp8_e4m3, fp8_e5m2; did you mean fp8_e4m3?"
    ]
    assert not (tmp_path / "orchestrate.db").exists()
