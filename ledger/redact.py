"""Secrets never reach MLflow or the ledger: what ``Redactor`` masks in params, tags, texts
and files, and in a proposal's words (a model's) before the ledger stores them."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REDACTED: Final = "***"
#: Text files larger than this are uploaded as they are rather than read in to be redacted.
MAX_REDACTED_FILE_BYTES: Final = 64 * 1024 * 1024


# A name is a secret's when one of its words is one of these (or ends in one of the longer
# ones: HFTOKEN, DBPASSWORD). Words, not substrings: `max_num_batched_tokens`,
# `num_speculative_tokens` and `tokenizer` are serving knobs, not secrets.
_SECRET_WORDS: Final = frozenset(
    {"KEY", "TOKEN", "SECRET", "SECRETS", "PASSWORD", "PASSWD", "APIKEY", "CREDENTIALS"}
)
_SECRET_SUFFIXES: Final = ("APIKEY", "TOKEN", "SECRET", "PASSWORD", "PASSWD")
# The names orchestrate itself gives params and tags whose "key" is a config's hash, never a
# secret: exact, lower-case, and only as a param's or tag's own name (``Redactor.value``). A
# user's ``CONFIG_KEY=…`` in a launcher or an environment stays a secret's name, and the value
# is still checked against the environment's secrets and the known key formats.
_OWN_NAMES: Final = frozenset({"config_key", "champion_key"})
_WORD_BOUNDARY: Final = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])")

# An environment secret shorter than this is matched only as a whole value, never inside a
# text: replacing every "1234" in every log would destroy the logs and protect nothing.
_MIN_SECRET_IN_TEXT: Final = 8
_MIN_SECRET_VALUE: Final = 6
# How far back a masked value's closing ``)`` looks for the parenthesis it closes.
_PAREN_LOOKBACK: Final = 500

_VALUE: Final = r"\"[^\"\n]*\"|'[^'\n]*'"
# Each pattern starts only where a name can start (the lookbehinds): without that a long run of
# name characters is tried from each of its positions, quadratic in its length.
_URL_PASSWORD: Final = re.compile(
    r"(?<![A-Za-z0-9+.\-])(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)[^@/\s]+@"
)
_ASSIGNMENT: Final = re.compile(
    r"(?<![A-Za-z0-9_.\-])(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)(?P<quote>[\"']?)"
    r"(?P<sep>[ \t]*[=:][ \t]*)"
    rf"(?P<value>{_VALUE}|[^\s\"',;}}\]]+)"
)
_FLAG: Final = re.compile(
    r"(?<![\w-])(?P<name>--?[A-Za-z][A-Za-z0-9_\-]*)(?P<sep>(?:[ \t]|\\\r?\n)+)"
    rf"(?P<value>{_VALUE}|[^\s\"'\-\\]\S*)"
)
_BEARER: Final = re.compile(r"(?i)\b(?P<name>bearer)(?P<sep>\s+)(?P<value>[\w.~+/=\-]{8,})")
_KNOWN_TOKENS: Final = re.compile(
    r"\bsk-ant-[\w\-]{8,}|\bsk-[A-Za-z0-9_\-]{20,}|\bhf_[A-Za-z0-9]{20,}"
    r"|\bgh[pousr]_[A-Za-z0-9]{20,}|\bAKIA[0-9A-Z]{16}\b|\bxox[abprs]-[A-Za-z0-9\-]{10,}"
)


def is_secret_name(name: str) -> bool:
    for word in _WORD_BOUNDARY.split(name):
        upper = word.upper()
        if upper in _SECRET_WORDS or (upper and upper.endswith(_SECRET_SUFFIXES)):
            return True
    return False


def _masked(match: re.Match[str]) -> str:
    value = match["value"]
    quote = value[0] if value[:1] in ("'", '"') else ""
    closing = "" if quote else _closing(match)
    head = match.group(0)[: match.start("value") - match.start()]
    return f"{head}{quote}{REDACTED}{quote}{closing}"


def _closing(match: re.Match[str]) -> str:
    """The ``)`` an unquoted value ends with that close a parenthesis opened before its name
    (``(… x-api-key: ***)``): kept, not masked. Only as many as the value itself leaves
    unbalanced and the text before it left open, so a secret with ``)`` in it is masked whole
    (``password=ab)cd``, ``password=abc)`` at the top level)."""
    value = match["value"]
    trailing = len(value) - len(value.rstrip(")"))
    unbalanced = value.count(")") - value.count("(")
    if min(trailing, unbalanced) <= 0:
        return ""
    # the line before it, at most _PAREN_LOOKBACK characters: linear on any text
    start = match.start()
    before = match.string[max(0, start - _PAREN_LOOKBACK) : start].rpartition("\n")[2]
    still_open = before.count("(") - before.count(")")
    return ")" * max(0, min(trailing, unbalanced, still_open))


def _masked_if_secret(match: re.Match[str]) -> str:
    return _masked(match) if is_secret_name(match["name"]) else match.group(0)


class Redactor:
    """Redacts secrets from what goes to MLflow.

    A value whose key names a secret becomes ``***``; so does a value equal to the current
    value of a secret-named environment variable (``ANTHROPIC_API_KEY``, ``HF_TOKEN``). In any
    other value or text: those environment values, ``NAME=value`` / ``"name": value`` and
    ``--flag value`` where the name is a secret's, URL passwords, bearer tokens and well-known
    key formats (``sk-ant-…``, ``hf_…``, ``ghp_…``, ``AKIA…``) become ``***``.
    """

    def __init__(self, secrets: Sequence[str]) -> None:
        self._whole = frozenset(s for s in secrets if len(s) >= _MIN_SECRET_VALUE)
        # longest first, so that a secret containing another is replaced whole
        self._inner = sorted(
            (s for s in secrets if len(s) >= _MIN_SECRET_IN_TEXT), key=len, reverse=True
        )

    @classmethod
    def from_environment(cls) -> Redactor:
        """Read the environment now: a key exported after the sink was made still counts."""
        return cls([v.strip() for k, v in os.environ.items() if is_secret_name(k) and v.strip()])

    def value(self, key: str, value: str) -> str:
        if (key not in _OWN_NAMES and is_secret_name(key)) or value.strip() in self._whole:
            return REDACTED
        return self.text(value)

    def text(self, text: str) -> str:
        for secret in self._inner:
            text = text.replace(secret, REDACTED)
        text = _URL_PASSWORD.sub(rf"\g<head>{REDACTED}@", text)
        text = _ASSIGNMENT.sub(_masked_if_secret, text)
        text = _FLAG.sub(_masked_if_secret, text)
        text = _BEARER.sub(_masked, text)
        return _KNOWN_TOKENS.sub(REDACTED, text)


def redacted_copy(source: Path, staging: Path, redactor: Redactor) -> Path | None:
    """A redacted copy of a UTF-8 text file under ``staging`` (same name), or None when the
    file is binary, too large, or has nothing to redact.

    Raises:
        OSError: the file cannot be read, or the copy cannot be written.
    """
    if source.stat().st_size > MAX_REDACTED_FILE_BYTES:
        return None
    data = source.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    redacted = redactor.value(source.name, text)
    if redacted == text:
        return None
    staging.mkdir(parents=True, exist_ok=True)
    copy = staging / source.name
    copy.write_text(redacted, encoding="utf-8")
    return copy
