"""A launcher script read as the shell would read it, as far as a launcher needs.

What is read: line continuations, comments, single and double quotes, backslash escapes,
``$NAME`` / ``${NAME}`` / ``${NAME:-default}`` from the script's own assignments, ``export``,
``NAME=value`` before a command, and commands separated by newlines, ``;``, ``&&``, ``||``,
``|`` and ``&``. What is not (command substitution, arithmetic, a variable the script never
sets): the word is marked unreadable with the reason, and only an error if a word the
profile needs is unreadable (``LauncherReadError``, naming the line and the token).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from knobs.errors import ProfileError

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: ``${NAME}``, ``${NAME:-default}``, ``${NAME-default}`` (a positional ``${1:-0}`` too).
_BRACED = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(:?-(.*))?$", re.S)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
#: Words that start a command but are no command of their own: ``exec vllm serve …``.
_PREFIXES = frozenset({"exec", "nohup", "setsid", "time", "then", "else", "do", "sudo", "!"})
_SEPARATORS = (";", "&&", "||", "|", "&")


class LauncherReadError(ProfileError):
    """A launcher ``orchestrate init`` cannot read: names the file, line and token."""

    def __init__(self, path: str, line: int, token: str, why: str) -> None:
        shown = token if len(token) <= 60 else token[:57] + "..."
        super().__init__(f"{path}:{line}: cannot read {shown!r}: {why}", path=path)
        self.line = line
        self.token = token


@dataclass(frozen=True)
class Word:
    """One shell word after quote removal and expansion; ``unreadable`` says why its value is
    not known (a command substitution, a variable the script never sets)."""

    text: str
    raw: str
    unreadable: str | None = None
    line: int = 0


@dataclass
class Command:
    """A simple command: its words, the ``NAME=value`` words before it, its first line."""

    line: int
    words: list[Word]
    env: dict[str, Word] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [w.text for w in self.words]


@dataclass
class Script:
    """A launcher read: its commands in order, the variables it exports (with their values),
    and the lines that were no command of interest (kept for the profile's notes)."""

    path: str
    commands: list[Command] = field(default_factory=list)
    exports: dict[str, Word] = field(default_factory=dict)
    variables: dict[str, Word] = field(default_factory=dict)

    def fail(self, line: int, token: str, why: str) -> LauncherReadError:
        return LauncherReadError(self.path, line, token, why)


def read_script(text: str, path: str) -> Script:
    """``text`` (a launcher script) read into commands, assignments and exports.

    Raises:
        LauncherReadError: an unterminated quote or ``${``.
    """
    script = Script(path=path)
    _read(text, script)
    return script


def _take(script: Script, line: int, words: list[Word]) -> None:
    """One simple command into ``script``: assignments, exports, or a command."""
    while words and words[0].text in _PREFIXES and words[0].raw == words[0].text:
        words = words[1:]
    env: dict[str, Word] = {}
    while words and (m := _ASSIGN.match(words[0].raw)) and words[0].raw.split("=")[0] == m[1]:
        w = words[0]
        env[m[1]] = Word(w.text.split("=", 1)[1], w.raw, w.unreadable, w.line)
        words = words[1:]
    if not words:
        script.variables.update(env)  # NAME=value alone: a shell variable
        return
    if words[0].text == "export":
        for w in words[1:]:
            if w.text.startswith("-"):
                continue
            name, sep, value = w.text.partition("=")
            if sep:
                word = Word(value, w.raw, w.unreadable, w.line)
                script.variables[name] = script.exports[name] = word
            elif name in script.variables:
                script.exports[name] = script.variables[name]
        return
    script.commands.append(Command(line=line, words=words, env=env))


def _read(text: str, script: Script) -> None:
    """``text`` split into simple commands, each taken into ``script`` as it ends, so that a
    later word expands the variables set before it (a shell runs them in order)."""
    words: list[Word] = []
    start = 1
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] == "\n":
            i, line = i + 2, line + 1
            continue
        if c in " \t":
            i += 1
            continue
        if c == "\n" or text.startswith(_SEPARATORS, i):
            if words:
                _take(script, start, words)
                words = []
            sep = next((s for s in ("&&", "||") if text.startswith(s, i)), c)
            line += c == "\n"
            i += len(sep)
            continue
        if c == "#" and (not words or text[i - 1] in " \t"):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if not words:
            start = line
        word, i, line = _word(text, i, line, script)
        words.append(word)
    if words:
        _take(script, start, words)


def _word(text: str, i: int, line: int, script: Script) -> tuple[Word, int, int]:
    """The word starting at ``text[i]``: (word, index after it, line after it)."""
    out: list[str] = []
    unreadable: str | None = None
    begin, first = i, line
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t\n" or text.startswith(_SEPARATORS, i):
            break
        if c == "\\":
            if i + 1 < n and text[i + 1] == "\n":
                i, line = i + 2, line + 1
                continue
            out.append(text[i + 1 : i + 2])
            i += 2
        elif c == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise script.fail(first, text[begin : begin + 40], "a ' that is never closed")
            out.append(text[i + 1 : end])
            line += text.count("\n", i, end)
            i = end + 1
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n and text[i + 1] in '"\\$`\n':
                    if text[i + 1] != "\n":
                        out.append(text[i + 1])
                    line += text[i + 1] == "\n"
                    i += 2
                elif text[i] in "$`":
                    value, i, why = _expand(text, i, script, first)
                    out.append(value)
                    unreadable = unreadable or why
                else:
                    line += text[i] == "\n"
                    out.append(text[i])
                    i += 1
            if i >= n:
                raise script.fail(first, text[begin : begin + 40], 'a " that is never closed')
            i += 1
        elif c in "$`":
            value, i, why = _expand(text, i, script, first)
            out.append(value)
            unreadable = unreadable or why
        else:
            out.append(c)
            i += 1
    return Word("".join(out), text[begin:i], unreadable, first), i, line


def _expand(text: str, i: int, script: Script, line: int) -> tuple[str, int, str | None]:
    """The expansion at ``text[i]`` (``$`` or a backtick): (value, index after, why it is
    unreadable or None)."""
    if text[i] == "`" or text.startswith("$(", i):
        depth, j = 0, i + (1 if text[i] == "`" else 2)
        close = "`" if text[i] == "`" else ")"
        while j < len(text) and not (text[j] == close and depth == 0):
            depth += text[j] == "(" and close == ")"
            depth -= text[j] == ")" and close == ")" and depth > 0
            j += 1
        shown = text[i : j + 1]
        return shown, j + 1, f"{shown} runs a command; write the value it gives"
    if text.startswith("${", i):
        end = text.find("}", i)
        if end < 0:
            raise script.fail(line, text[i : i + 40], "a ${ that is never closed")
        shown = text[i : end + 1]
        m = _BRACED.match(text[i + 2 : end])
        if m is None:
            return shown, end + 1, f"{shown} is more shell than a launcher needs"
        return _value(script, m[1], m[3] if m[2] else None, shown, end + 1)
    m = _NAME.match(text, i + 1) or re.compile(r"[0-9]").match(text, i + 1)
    if m is None:
        return "$", i + 1, None
    return _value(script, m[0], None, text[i : m.end()], m.end())


def _value(
    script: Script, name: str, default: str | None, shown: str, after: int
) -> tuple[str, int, str | None]:
    word = script.variables.get(name)
    if word is not None and (word.text or default is None):
        return word.text, after, word.unreadable
    if default is not None:
        return default, after, None
    return shown, after, f"{shown} is not set in the launcher; set it there or write the value"
