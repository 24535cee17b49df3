"""The shared prompt sets of the bench cells and the twin engine.

The bench client builds every request from these sets and the twin engine looks a request's
prompt up in them to know its category, so both sides agree without talking. Tokens are words
here (the twin counts a prompt's tokens as its whitespace-separated words): a prompt built for
``context_tokens`` has exactly ``context_tokens + BASE_TOKENS`` words, a filler block of context
followed by a blank line and one of the category's base prompts.

Imports nothing but the standard library and ``knobs`` (the engine runs this on every node).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Final, get_args

from knobs.records import Category

#: The categories of a bench cell, in a fixed order.
CATEGORIES: Final[tuple[Category, ...]] = get_args(Category)

#: Words every built prompt has on top of its context: the base prompt padded to this length.
BASE_TOKENS: Final = 64

#: Separates the context block from the base prompt. No base prompt contains it.
SEPARATOR: Final = "\n\n"

_BASE: Final[dict[Category, tuple[str, ...]]] = {
    "prose": (
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Describe a walk through an autumn forest at dawn, in the style of a nature essay.",
        "Explain to a curious ten-year-old why the sky is blue and sunsets are red.",
        "Write a letter from a retired sailor to his granddaughter about his first voyage.",
        "Summarise the history of the printing press and its effect on European culture.",
        "Write a reflective essay on what it means to learn a new language as an adult.",
        "Tell the story of a small bakery that survives a hard winter in a mountain town.",
        "Describe the sounds, smells and people of a busy train station at rush hour.",
    ),
    "code": (
        "Write a Python function that merges overlapping intervals and returns them sorted.",
        "Implement a thread-safe LRU cache in Python with get, put and a capacity limit.",
        "Write a Rust function that parses a CSV line with quoted fields into a vector.",
        "Implement binary search over a sorted list of integers in C and explain edge cases.",
        "Write a SQL query that returns the top three customers by revenue per region.",
        "Write a TypeScript function that debounces another function with a delay in ms.",
        "Implement a trie in Go with insert, search and prefix search, with unit tests.",
        "Write a bash script that rotates log files older than seven days and compresses them.",
    ),
    "structured": (
        "Return a JSON object with fields name, age and email for three fictional users.",
        "Produce a YAML list of five planets with their mass, radius and number of moons.",
        "Return a JSON array of ten ISO country codes with their capital cities and currencies.",
        "Emit a CSV table with columns date, open, high, low and close for five trading days.",
        "Return a JSON schema for an invoice with line items, totals, taxes and a due date.",
        "Produce a JSON object mapping each weekday to a list of three scheduled meetings.",
        "Return an XML document describing a library with four books and their authors.",
        "Return a JSON list of six HTTP status codes with their names and a one-line meaning.",
    ),
    "agentic": (
        "You are a coding agent. The test suite fails on test_parse_dates. Find the cause and "
        "propose a patch.",
        "You are an agent with a shell tool. List the largest files in the repository and "
        "suggest which to ignore.",
        "You are a coding agent. Add retry with exponential backoff to the HTTP client and "
        "update its tests.",
        "You are an agent with a search tool. Find where the config file is loaded and add "
        "validation of the port.",
        "You are a coding agent. The CI job times out. Read the workflow and make the slow "
        "step cacheable.",
        "You are an agent with an editor tool. Rename the function fetch_all to fetch_pages "
        "across the code base.",
        "You are a coding agent. A user reports a crash on empty input. Reproduce it, fix it "
        "and add a test.",
        "You are an agent with a database tool. Write a migration that adds an index on "
        "orders.created_at.",
    ),
}


# Words the context blocks and the twin's generated texts are made of, per category.
def _split(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_WORDS: Final[dict[Category, tuple[str, ...]]] = {
    "prose": _split(
        "the a of and to in was that it with as for his her on at by from they we "
        "light sea wind morning river stone house road night old small quiet long "
        "remembered walked looked said found turned heard began slowly again still"
    ),
    "code": _split(
        "def return if else for in while self None True False import from class "
        "value key index result items list dict len range append break continue "
        "node left right count buffer error raise try except with as yield ="
    ),
    "structured": _split(
        '{ } [ ] : , "name" "id" "value" "type" "items" "count" "date" "price" '
        '"status" "ok" "error" true false null 0 1 2 3 42 100 "a" "b" "c" "total"'
    ),
    "agentic": _split(
        "run tool call result file path test fix patch diff error line read write "
        "search open edit commit check step next plan because then output status "
        "function module config the a to of and it is"
    ),
}


@dataclass(frozen=True)
class Prompt:
    """One built prompt: its id (``category/index+context``), category, text and token count."""

    id: str
    category: Category
    index: int
    context_tokens: int
    text: str

    @property
    def tokens(self) -> int:
        """Tokens (words) of the prompt: always ``context_tokens + BASE_TOKENS``."""
        return self.context_tokens + BASE_TOKENS


def base_prompts(category: Category) -> tuple[str, ...]:
    """The base prompts of ``category``, in order.

    Raises:
        KeyError: not a category.
    """
    return _BASE[category]


def vocabulary(category: Category) -> tuple[str, ...]:
    """The words the twin builds texts of for ``category`` (context blocks, generations)."""
    return _WORDS[category]


def prompt_tokens(context_tokens: int) -> int:
    """Tokens of every prompt built for ``context_tokens`` (the twin's prefill length)."""
    return context_tokens + BASE_TOKENS


def count_tokens(text: str) -> int:
    """Tokens of ``text`` as the twin counts them: whitespace-separated words."""
    return len(text.split())


def _filler(category: Category, count: int, salt: str) -> str:
    """``count`` deterministic words of ``category``'s vocabulary, a sentence break every 12."""
    words = _WORDS[category]
    seed = int.from_bytes(hashlib.sha256(f"{category}:{salt}".encode()).digest()[:8], "big")
    out: list[str] = []
    state = seed
    for i in range(count):
        # a 64-bit LCG: fast, deterministic across Python versions and platforms
        state = (state * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        word = words[(state >> 33) % len(words)]
        out.append(word + ("." if i % 12 == 11 else ""))
    return " ".join(out)


@lru_cache(maxsize=256)
def build_prompt(category: Category, context_tokens: int = 0, index: int = 0) -> Prompt:
    """Prompt ``index`` (taken modulo the set's size) of ``category`` with a context block.

    The text is ``<context block>\\n\\n<base prompt>`` with exactly
    ``context_tokens + BASE_TOKENS`` words; the same arguments always give the same text.

    Raises:
        KeyError: not a category.
        ValueError: negative ``context_tokens``.
    """
    if context_tokens < 0:
        raise ValueError(f"context_tokens must be >= 0, not {context_tokens}")
    bases = _BASE[category]
    i = index % len(bases)
    base = bases[i]
    pad = context_tokens + BASE_TOKENS - count_tokens(base)
    context = _filler(category, pad, f"{i}:{context_tokens}")
    return Prompt(
        id=f"{category}/{i}+{context_tokens}",
        category=category,
        index=i,
        context_tokens=context_tokens,
        text=f"{context}{SEPARATOR}{base}",
    )


_LOOKUP: Final[dict[str, tuple[Category, int]]] = {
    base: (category, i) for category, bases in _BASE.items() for i, base in enumerate(bases)
}


def classify(text: str) -> tuple[Category, int | None]:
    """The category of a prompt and its base index, by exact lookup of its last paragraph.

    A text that is not built from the shared sets is ``("prose", None)``.
    """
    last = text.rsplit(SEPARATOR, 1)[-1].strip()
    found = _LOOKUP.get(last)
    if found is None:
        return "prose", None
    return found
