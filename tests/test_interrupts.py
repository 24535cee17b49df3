"""``interrupts.unbroken``: a teardown's block holds the signals that would cut it short, and
delivers them as they came when it ends; a signal ignored stays ignored. Real signals sent to
this process (``signal.raise_signal``), its handlers restored afterwards."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from orchestrator.interrupts import HELD, unbroken


@pytest.fixture
def handlers() -> Iterator[list[int]]:
    """SIGTERM interrupts (as ``ended_like_ctrl_c`` has it), SIGHUP is ignored (``nohup``):
    the signals the interrupt handler saw."""
    seen: list[int] = []

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        seen.append(signum)
        raise KeyboardInterrupt

    previous = {
        signal.SIGTERM: signal.signal(signal.SIGTERM, interrupt),
        signal.SIGHUP: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    }
    try:
        yield seen
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_signal_in_a_teardown_ends_the_command_once_it_is_done(
    handlers: list[int], capfd: pytest.CaptureFixture[str]
) -> None:
    done: list[str] = []
    with pytest.raises(KeyboardInterrupt), unbroken():
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)  # a second one is held too, and said once
        signal.raise_signal(signal.SIGHUP)  # ignored when the command started: still
        assert handlers == []
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        done.append("every node stopped")
    assert done == ["every node stopped"]
    assert handlers == [signal.SIGTERM]  # delivered at the block's end, once
    assert capfd.readouterr().err.splitlines() == [HELD.format(name="SIGTERM")]
    assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN


def test_a_teardown_inside_another_holds_until_the_outer_one_ends(handlers: list[int]) -> None:
    with pytest.raises(KeyboardInterrupt), unbroken():
        with unbroken():
            signal.raise_signal(signal.SIGTERM)
        assert handlers == []  # the boot's end, after the nodes' stops, is not cut short
    assert handlers == [signal.SIGTERM]


def test_a_hangup_silences_a_terminal_or_pipe_but_keeps_a_file(tmp_path: Path) -> None:
    """After a SIGHUP nothing reads the terminal, so the rest of the output goes to /dev/null;
    output sent to a file (`orchestrate round > night.log`) keeps every line (the QA pass:
    the log ended at `tearing down`)."""
    code = (
        "from orchestrator.interrupts import _quiet_terminal; "
        "print('before', flush=True); _quiet_terminal(); print('after', flush=True)"
    )
    log = tmp_path / "night.log"
    with log.open("w") as out:
        subprocess.run([sys.executable, "-c", code], stdout=out, check=True)
    assert log.read_text().split() == ["before", "after"]
    piped = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert piped.stdout.split() == ["before"]
