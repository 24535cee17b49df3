"""vLLM-formatted log lines: ``INFO 11-29 08:40:01 [api_server.py:1351] message``.

Everything goes to stdout, flushed per line (the launcher redirects it to the node's log), so
boot-log gates and tests can read the lines as they come.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

_LOCK = threading.Lock()


class EngineLog:
    """A writer of vLLM-style log lines; ``where`` names the source file and line vLLM would."""

    def __init__(self, stream: TextIO | None = None, prefix: str = "") -> None:
        self._stream = stream
        self._prefix = prefix

    def _write(self, level: str, where: str, message: str) -> None:
        stamp = time.strftime("%m-%d %H:%M:%S")
        line = f"{self._prefix}{level} {stamp} [{where}] {message}\n"
        stream = self._stream or sys.stdout
        with _LOCK:
            try:
                stream.write(line)
                stream.flush()
            except (OSError, ValueError):
                pass  # a closed log must never take the engine down

    def info(self, where: str, message: str) -> None:
        """An INFO line."""
        self._write("INFO", where, message)

    def warning(self, where: str, message: str) -> None:
        """A WARNING line."""
        self._write("WARNING", where, message)

    def error(self, where: str, message: str) -> None:
        """An ERROR line."""
        self._write("ERROR", where, message)

    def raw(self, text: str) -> None:
        """A line as is (uvicorn's ``INFO:     Application startup complete.``)."""
        stream = self._stream or sys.stdout
        with _LOCK:
            try:
                stream.write(text + "\n")
                stream.flush()
            except (OSError, ValueError):
                pass
