"""The twin's greedy generations: deterministic per prompt, identical across configurations.

Speculative decoding is lossless, so the greedy text of a prompt must not depend on K, the
drafter, MNBT, CUDA graphs or the KV dtype. The one exception is the landscape's trap: a
configuration whose verifier accepts position 0 unchecked emits a different text.
A token is a word; the text of ``n`` tokens is ``" w1 w2 … wn"`` (each token has its space).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

from cluster import prompts

#: Every ``TRAP_PERIOD``-th token (from the second) differs in a trap configuration's output.
TRAP_PERIOD = 5


@lru_cache(maxsize=512)
def _words(prompt: str, count: int) -> tuple[str, ...]:
    category, _ = prompts.classify(prompt)
    vocab = prompts.vocabulary(category)
    digest = hashlib.sha256(prompt.encode()).digest()
    state = int.from_bytes(digest[:8], "big") | 1
    out: list[str] = []
    for _ in range(count):
        # xorshift64*: cheap and stable; the words only need to look arbitrary and repeat exactly
        state ^= (state >> 12) & 0xFFFFFFFFFFFFFFFF
        state ^= (state << 25) & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 27
        out.append(vocab[((state * 2685821657736338717) & 0xFFFFFFFFFFFFFFFF) % len(vocab)])
    return tuple(out)


def greedy_tokens(prompt: str, count: int, *, trap: bool = False) -> tuple[str, ...]:
    """The first ``count`` greedy tokens for ``prompt`` (a prefix of any longer generation).

    With ``trap`` the tokens at positions 1, 1 + TRAP_PERIOD, … are replaced by the next word of
    the vocabulary: what a verifier that accepts an unchecked draft token produces.
    """
    words = _words(prompt, count)
    if not trap:
        return words
    category, _ = prompts.classify(prompt)
    vocab = prompts.vocabulary(category)
    changed = list(words)
    for i in range(1, count, TRAP_PERIOD):
        changed[i] = vocab[(vocab.index(changed[i]) + 1) % len(vocab)]
    return tuple(changed)


def join(tokens: tuple[str, ...] | list[str]) -> str:
    """Tokens as text: each word with its leading space."""
    return "".join(" " + t for t in tokens)


def greedy_text(prompt: str, count: int, *, trap: bool = False) -> str:
    """The greedy text of ``count`` tokens for ``prompt`` (see ``greedy_tokens``)."""
    return join(greedy_tokens(prompt, count, trap=trap))


def fingerprint(text: str) -> str:
    """The sha256 hex digest of a generated text, as the bench client records it."""
    return hashlib.sha256(text.encode()).hexdigest()
