"""Shell completion, in a real bash: the script ``orchestrate --show-completion bash`` prints is
sourced, bash's completion function is called as bash calls it on TAB, and what it offers is
read from ``COMPREPLY``: commands, options, the values an option takes (embedded profiles,
proposers, approval modes). ``--install-completion bash`` sets it up in a fresh home so that an
interactive bash has it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from orchestrator.profile_names import embedded_profiles

BIN = Path(sys.executable).parent
BASH = shutil.which("bash")


def _bash(script: str, home: Path, *, interactive: bool = False) -> str:
    assert BASH is not None, "bash is not installed"
    assert (BIN / "orchestrate").exists(), (
        f"no orchestrate console script in {BIN}: pip install -e ."
    )
    env = {**os.environ, "HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        [BASH, *(["-i"] if interactive else []), "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _offers(home: Path, *words: str) -> list[str]:
    """What TAB offers after ``orchestrate WORDS`` (the last word is the one being typed)."""
    quoted = " ".join(f"'{w}'" for w in ("orchestrate", *words))
    script = (
        "source <(orchestrate --show-completion bash)\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD={len(words)}\n"
        "_orchestrate_completion orchestrate\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    return [w for w in _bash(script, home).splitlines() if w]


def test_bash_completes_commands_options_and_values(tmp_path: Path) -> None:
    assert _offers(tmp_path, "ro") == ["round"]
    assert _offers(tmp_path, "proposals", "") == ["list", "show", "approve", "veto"]
    assert "--budget" in _offers(tmp_path, "round", "--b")
    assert _offers(tmp_path, "round", "--proposer", "") == ["optuna", "sweep", "claude", "hybrid"]
    assert _offers(tmp_path, "round", "--approve", "q") == ["queue"]
    assert _offers(tmp_path, "status", "--profile", "") == embedded_profiles()
    assert _offers(tmp_path, "export", "-p", "vllm-") == [
        p for p in embedded_profiles() if p.startswith("vllm-")
    ]
    assert _offers(tmp_path, "export", "--optuna") == ["--optuna-storage"]


def test_install_completion_sets_up_an_interactive_bash(tmp_path: Path) -> None:
    # as a user types it at a bash prompt: bash is the command's parent, where typer looks
    # for the shell (`bash -c` with one command would exec it and leave the test's process
    # as its parent)
    _bash("orchestrate --install-completion; true", tmp_path)
    assert "orchestrate" in (tmp_path / ".bashrc").read_text()
    registered = _bash("complete -p orchestrate", tmp_path, interactive=True)
    assert "-F _orchestrate_completion orchestrate" in registered
