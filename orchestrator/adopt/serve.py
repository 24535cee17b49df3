"""A `vllm serve` invocation found in a launcher's command: what runs it (``vllm serve``, a
path to ``vllm``, ``python -m vllm.entrypoints.cli.main serve``, or ``docker run …
--entrypoint vllm IMAGE serve``), the model, and its options in order.

vLLM's options are read without vLLM: ``--flag=value`` and ``--flag value`` take a value,
``--flag`` before another option (or a switch vLLM is known to have) takes none. Where the
engine is installed, its own parser checks the result (``make test-real``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from cluster.engine_process import DOCKER_SWITCHES
from orchestrator.adopt.shell import Command, Script

#: Options of `vllm serve` that take no value, for when the model follows one of them.
SWITCHES = frozenset(
    {
        "--headless",
        "--enforce-eager",
        "--enable-expert-parallel",
        "--trust-remote-code",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enable-chunked-prefill",
        "--no-enable-chunked-prefill",
        "--disable-log-requests",
        "--disable-log-stats",
        "--enable-log-requests",
        "--enable-auto-tool-choice",
        "--disable-custom-all-reduce",
        "--async-scheduling",
        "--enable-lora",
        "--disable-frontend-multiprocessing",
        "--skip-tokenizer-init",
        "--enable-sleep-mode",
    }
)
#: ``docker run`` options a launcher drops: the engine runs in the foreground, its output is
#: the node's log, and no terminal is attached (``-it`` without one fails).
_DETACHED = frozenset({"--detach", "--interactive", "--tty"})
#: A number as a command line writes it (``-1``, ``0.80``, ``1e-3``): a value, never an option.
NUMBER = re.compile(r"^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$")


@dataclass(frozen=True)
class Option:
    """One option of the serve command: ``flag`` and its ``value`` (None: a switch)."""

    flag: str
    value: str | None

    def tokens(self) -> list[str]:
        return [self.flag] if self.value is None else [self.flag, self.value]


@dataclass
class Serve:
    """A `vllm serve` invocation: ``prefix`` runs it (up to and including ``serve``; for a
    container, ``docker run`` and its options, the image, and ``serve`` when the entrypoint
    is set), then ``model`` (the positional; empty when ``--model`` names it) and the
    ``options``."""

    line: int
    prefix: list[str]
    model: str
    options: list[Option]
    env: dict[str, str] = field(default_factory=dict)
    #: ``docker run`` options dropped from the prefix (``-d``, ``-i``, ``-t``: the launcher runs
    #: the engine in the foreground, with no terminal; its output is the node's log).
    dropped: list[str] = field(default_factory=list)

    @property
    def model_name(self) -> str:
        """The model: the positional, else ``--model``'s value."""
        return self.model or self.get("--model") or ""

    def get(self, flag: str) -> str | None:
        """The value of ``flag`` (its last occurrence), or None."""
        values = [o.value for o in self.options if o.flag == flag]
        return values[-1] if values else None

    def has(self, flag: str) -> bool:
        return any(o.flag == flag for o in self.options)

    @property
    def headless(self) -> bool:
        return self.has("--headless")

    @property
    def container(self) -> str | None:
        """The container's ``--name``, when it runs in one."""
        for i, word in enumerate(self.prefix[:-1]):
            if word == "--name":
                return self.prefix[i + 1]
            if word.startswith("--name="):
                return word.split("=", 1)[1]
        return None


def find_serves(script: Script) -> list[Serve]:
    """Every `vllm serve` invocation of ``script``, in order.

    Raises:
        LauncherReadError: a serve command with a word whose value is not known.
    """
    out = []
    for command in script.commands:
        found = _serve(command)
        if found is None:
            continue
        for word in command.words:
            if word.unreadable is not None:
                raise script.fail(command.line, word.raw, word.unreadable)
        out.append(found)
    return out


def _serve(command: Command) -> Serve | None:
    argv = command.argv
    env = {k: w.text for k, w in command.env.items()}
    if argv[:2] == ["docker", "run"] or argv[:3] == ["docker", "container", "run"]:
        return _docker(command, argv[argv.index("run") + 1 :], argv[: argv.index("run") + 1])
    for i, word in enumerate(argv):
        if word == "serve" and i > 0 and Path(argv[i - 1]).name == "vllm":
            model, options = read_options(argv[i + 1 :])
            return Serve(command.line, argv[: i + 1], model, options, env)
        if word == "serve" and argv[i - 1 : i] == ["vllm.entrypoints.cli.main"]:
            model, options = read_options(argv[i + 1 :])
            return Serve(command.line, argv[: i + 1], model, options, env)
    return None


def _docker(command: Command, rest: list[str], head: list[str]) -> Serve | None:
    """``docker run OPTIONS IMAGE [CMD…]`` when the container runs `vllm serve`."""
    prefix = list(head)
    dropped: list[str] = []
    entrypoint = None
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        word = rest[i]
        takes = word not in DOCKER_SWITCHES and "=" not in word
        takes = takes and not re.fullmatch(r"-[dit]+", word)
        if word in _DETACHED or re.fullmatch(r"-[dit]+", word):
            dropped.append(word)
            i += 1
            continue
        if word in ("--entrypoint",) and i + 1 < len(rest):
            entrypoint = rest[i + 1]
        elif word.startswith("--entrypoint="):
            entrypoint = word.split("=", 1)[1]
        prefix += rest[i : i + (2 if takes else 1)]
        i += 2 if takes else 1
    if i >= len(rest):
        return None
    image, cmd = rest[i], rest[i + 1 :]
    prefix.append(image)
    if entrypoint is not None and Path(entrypoint).name == "vllm" and cmd[:1] == ["serve"]:
        prefix.append("serve")
        cmd = cmd[1:]
    elif cmd[:2] == ["vllm", "serve"]:
        prefix += ["vllm", "serve"]
        cmd = cmd[2:]
    elif entrypoint is None and "vllm" in image and (not cmd or cmd[0] != "vllm"):
        pass  # the vllm/vllm-openai images' entrypoint is `vllm serve`: arguments follow
    else:
        return None
    model, options = read_options(cmd)
    env = {k: w.text for k, w in command.env.items()}
    return Serve(command.line, prefix, model, options, env, dropped)


def read_options(tokens: list[str]) -> tuple[str, list[Option]]:
    """The model (the positional; empty when there is none) and the options of the words
    after ``serve``."""
    model = ""
    options: list[Option] = []
    i = 0
    while i < len(tokens):
        word = tokens[i]
        if not word.startswith("-") or NUMBER.match(word):
            if not model:
                model = word
            else:
                options.append(Option(word, None))  # a stray positional: kept as it is
            i += 1
            continue
        if "=" in word and word.startswith("--"):
            flag, value = word.split("=", 1)
            options.append(Option(flag, value))
            i += 1
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else None
        switch = word in SWITCHES or word.startswith("--no-")
        if nxt is None or switch or (nxt.startswith("-") and not NUMBER.match(nxt)):
            options.append(Option(word, None))
            i += 1
        else:
            options.append(Option(word, nxt))
            i += 2
    return model, options
