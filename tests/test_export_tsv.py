"""``orchestrate export``'s results.tsv where it lands: a directory, a path with no directory,
stdout that cannot be written, and a results.tsv replaced whole."""

from __future__ import annotations

import os
import resource
import subprocess
from pathlib import Path

import pytest

from ledger import Ledger
from tests.fixtures.cli import ORCHESTRATE, orchestrate

HEADER = "experiment\tobjective\tdelta_pct\taccept_len\tstatus\tknob\tvalue\tdescription\n"


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A folder with an empty ledger of its own (results.tsv: the header alone)."""
    Ledger(f"sqlite:///{tmp_path}/orchestrate.db").close()
    return tmp_path


def test_a_directory_gets_its_results_tsv_and_a_missing_one_is_one_line(workdir: Path) -> None:
    (workdir / "out").mkdir()
    done = orchestrate(workdir, "export", "out", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (workdir / "out" / "results.tsv").read_text() == HEADER
    assert done.stderr.strip() == "wrote out/results.tsv (0 experiments)"
    # a path that ends in / names a directory: one that is not there is not made a file
    done = orchestrate(workdir, "export", "missing/", timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == "Error: cannot write missing/: no such directory"
    assert not (workdir / "missing").exists()


def test_stdout_that_cannot_be_written_is_one_line_not_a_traceback(workdir: Path) -> None:
    with open("/dev/full", "w") as full:
        done = orchestrate_to(workdir, full.fileno())
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "Error: cannot write results.tsv to stdout: No space left on device"
    ]


def orchestrate_to(workdir: Path, fd: int) -> subprocess.CompletedProcess[str]:
    """``orchestrate export -`` with its stdout on ``fd``."""
    return subprocess.run(
        [*ORCHESTRATE, "export", "-"],
        cwd=workdir,
        stdout=fd,
        stderr=subprocess.PIPE,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_results_tsv_is_replaced_whole_and_a_link_keeps_naming_it(workdir: Path) -> None:
    """The new results.tsv is written beside the old one and renamed over it (a disk that
    fills mid-write leaves the old one whole); a link to it stays a link, its file
    replaced; nothing is left beside it."""
    kept = workdir / "kept.tsv"
    kept.write_text("an older export\n" * 100)
    (workdir / "results.tsv").symlink_to(kept)
    done = orchestrate(workdir, "export", timeout=60)
    assert done.returncode == 0, done.stderr
    assert (workdir / "results.tsv").is_symlink()
    assert kept.read_text() == HEADER
    assert [n for n in os.listdir(workdir) if n.endswith(".tmp")] == []


def test_a_write_that_fails_midway_leaves_the_results_tsv_before_it(workdir: Path) -> None:
    """The file size limit (``ulimit -f``) stops the write past its first bytes, as a disk
    that fills does: the command says so in one line, and the old results.tsv is whole."""
    old = "an older export\n" * 100
    (workdir / "results.tsv").write_text(old)

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(HEADER) // 2, resource.RLIM_INFINITY))

    done = subprocess.run(
        [*ORCHESTRATE, "export"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        preexec_fn=small_files,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == ["Error: cannot write results.tsv: File too large"]
    assert (workdir / "results.tsv").read_text() == old
    assert [n for n in os.listdir(workdir) if n.endswith(".tmp")] == []
