"""The signals that end a command, and the teardown they may not cut short.

SIGTERM (a service manager, ``kill``) and SIGHUP (the terminal or the SSH session to this
machine gone) end a command as Ctrl-C does (``ended_like_ctrl_c``): the boot in flight is torn
down, the claims and the lease released, and the same command resumes.

A teardown that has begun finishes (``unbroken``): every node's log kept, every engine stopped,
the boot closed in the ledger. A signal that arrives meanwhile (a second Ctrl-C, a second
SIGTERM from a service manager that stops with a grace period, the SSH session dropping) is
held until the teardown is done, and then ends the command as it would have. Cut short, the
teardown would leave engines running on the nodes, unrecorded, until the next command. A person
who presses Ctrl-C again is told so in one line; ``kill -9`` is the way to leave the engines up.

A signal ignored when the command started (``nohup``'s SIGHUP; SIGINT that a script's
background job inherits ignored) stays ignored, in both.

A reader of the output that goes away (``orchestrate status | head -1``; the ``tee`` of
``orchestrate round | tee night.log`` killed) is a SIGHUP without the signal
(``outliving_readers``): the rest of that output goes to /dev/null, and a command that pays
for nothing goes on. Before, the first line written after it ended the command with exit code
1 and nothing said: a round, mid-boot, at once. A round stops at its next safe point, before
its next boot (``stop_if_unread``), as a SIGHUP would have stopped it: nobody reads what it
does, and every boot after it is paid for nothing (``orchestrate round | head -3`` spent its
whole budget).
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

from cluster.signals import held

#: What a person (or a service manager's log) reads when a signal comes during a teardown.
HELD = (
    "{name} while the nodes are stopped: the teardown finishes first (cut short, it would "
    "leave engines running on the nodes), then the command ends; kill -9 leaves them up for "
    "`orchestrate cluster down`"
)

_NAMES: dict[int, str] = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}
_depth = 0
#: The descriptors ``outliving_readers`` looks after (a pipe's or a socket's), and those of
#: them whose reader was found gone (``stop_if_unread``).
_watched: set[int] = set()
_unread: set[int] = set()


def _quiet_terminal() -> None:
    """Nothing reads the terminal any more (SIGHUP): the rest of the output goes to
    /dev/null, so that writing it cannot stop what the command still does. Output to a file
    (`orchestrate round > night.log`) is kept: a file takes every line whoever hung up."""
    for fd in (1, 2):
        if not _a_file(fd):
            _to_devnull(fd)


def _to_devnull(fd: int) -> None:
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, fd)
    os.close(quiet)


class _Outliving(io.RawIOBase):
    """A standard stream's descriptor whose reader may go away: the write its reader is gone
    for goes to /dev/null, as every later one does (the descriptor is /dev/null's now)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: ReadableBuffer, /) -> int:
        try:
            return os.write(self._fd, data)
        except BrokenPipeError:
            _unread.add(self._fd)
            _to_devnull(self._fd)
            return memoryview(data).nbytes


def _outliving(stream: TextIO) -> TextIO:
    stream.flush()
    return io.TextIOWrapper(
        io.BufferedWriter(_Outliving(stream.fileno())),
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=bool(stream.line_buffering),
        write_through=getattr(stream, "write_through", False),
    )


def outliving_readers() -> None:
    """``sys.stdout`` and ``sys.stderr`` (the process's own, on descriptors 1 and 2), where
    they are a pipe or a socket (what has a reader that can go away), from now on send what
    their reader is gone for to /dev/null, and the command goes on (``| head``). A terminal,
    a file or a device keeps Python's own stream and its errors (``export -`` to a full disk
    says so in one line). Called once, by the command line's entry point."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
            fd = stream.fileno()
            mode = os.fstat(fd).st_mode
            if fd in (1, 2) and (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
                setattr(sys, name, _outliving(stream))
                _watched.add(fd)


def _reader_gone(fd: int) -> bool:
    """Whether ``fd``'s reader went away: a write to it met a broken pipe, or (nothing
    written since) the pipe says it has no reader (``POLLERR`` on its write end)."""
    if fd in _unread:
        return True
    if fd not in _watched:
        return False
    try:
        events = select.poll()
        events.register(fd, select.POLLOUT)
        gone = any(e & (select.POLLERR | select.POLLHUP) for _, e in events.poll(0))
    except (OSError, ValueError):
        return False
    if gone:
        _unread.add(fd)
        _to_devnull(fd)
    return gone


def stop_if_unread() -> None:
    """A round's safe point before its next boot: where the reader of its standard output
    went away (``orchestrate round | head -3``; the ``tee`` of ``| tee night.log`` ended),
    the round stops here as a SIGHUP would have stopped it, with nothing in flight (every
    earlier boot torn down and recorded), for the same command to resume. Only a command
    whose stdout ``outliving_readers`` looks after (the console entry point's pipe or
    socket) is ever stopped so.

    Raises:
        Ended: SIGPIPE, its reader gone (``ended_by`` says so).
    """
    if _reader_gone(1):
        raise Ended(signal.SIGPIPE)


def _a_file(fd: int) -> bool:
    """Whether ``fd`` writes to a regular file (not a terminal, a pipe or a socket)."""
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


class Ended(KeyboardInterrupt):
    """A SIGTERM or SIGHUP, ending the command as Ctrl-C does (``ended_like_ctrl_c``), or a
    SIGPIPE without the signal (``stop_if_unread``); which one it was is kept for the record
    (``ended_by``)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: What ended a command, in a person's words, by the signal (``ended_by``).
_ENDED_BY = {
    signal.SIGINT: "Ctrl-C",
    signal.SIGTERM: "SIGTERM (a service manager's stop, `kill`)",
    signal.SIGHUP: "SIGHUP (its terminal or SSH session closed)",
    signal.SIGPIPE: (
        "SIGPIPE (the reader of its output went away: `| head`, a `tee` that ended; it "
        "stopped before its next boot)"
    ),
}


def ended_by(interrupt: KeyboardInterrupt) -> str:
    """Which signal ended the command, in a person's words: Ctrl-C for a ``KeyboardInterrupt``
    of Python's or asyncio's own (SIGINT), else the SIGTERM or SIGHUP ``Ended`` carries."""
    signum = interrupt.signum if isinstance(interrupt, Ended) else signal.SIGINT
    return _ENDED_BY.get(signal.Signals(signum), signal.Signals(signum).name)


@contextlib.contextmanager
def ended_like_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP raise ``KeyboardInterrupt`` as Ctrl-C does, while in the block.
    Without this Python dies at once and leaves the engines running on the nodes. After a
    SIGHUP the output goes to /dev/null. A signal that was ignored when the command started
    (``nohup``) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            _quiet_terminal()
        raise Ended(signum)

    # a signal set to be ignored stays so: `nohup orchestrate round …` asked to outlive its
    # terminal, and it does
    ours = [s for s in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(s) == signal.SIG_DFL]
    previous = {s: signal.signal(s, interrupt) for s in ours}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def unbroken() -> Iterator[None]:
    """A teardown: SIGINT, SIGTERM and SIGHUP that arrive in the block are held until it ends,
    then delivered as they came (the first one's ``KeyboardInterrupt`` raised where the block
    ends; ``cluster.signals.held``). The first Ctrl-C or SIGTERM held says ``HELD`` on stderr;
    a SIGHUP sends the rest of the output to /dev/null at once, as it would have. Only a
    signal that would have interrupted the command is held: one ignored stays ignored, one
    left to its default (a library's caller that asked for no interrupt) keeps it. A block
    inside another holds nothing more, and off the main thread (where no signal is handled)
    it holds nothing."""
    global _depth
    if _depth or threading.current_thread() is not threading.main_thread():
        yield
        return

    def say(signum: int, before: list[int]) -> None:
        if signum == signal.SIGHUP:
            _quiet_terminal()
        elif not any(s in _NAMES for s in before):
            with contextlib.suppress(OSError):
                os.write(2, (HELD.format(name=_NAMES[signum]) + "\n").encode())

    _depth += 1
    try:
        with held(say):
            yield
    finally:
        _depth -= 1
