"""docs/profile.md stays whole: its table of every key has one row for each key a profile may
set, none for a key the code lost, and each row says what the key does; its knob examples
load as knobs."""

from __future__ import annotations

import re
import typing
from pathlib import Path

import yaml
from pydantic import BaseModel

from knobs.space import KnobSpace
from knobs.spec import KnobSpec
from orchestrator.profile import Profile

DOC = Path(__file__).resolve().parent.parent / "docs" / "profile.md"


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every key under ``model``, dotted, nested models included (each once per path)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        out.append(prefix + name)
        for sub in _models(field.annotation):
            out += keys(sub, f"{prefix}{name}.")
    return out


def _models(annotation: object) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models(arg)]


def documented() -> dict[str, str]:
    """The table of every key: key → what it does."""
    table = DOC.read_text().split("## Every key", 1)[1]
    rows = re.findall(r"^\| `([a-z0-9_.]+)` \|[^|\n]*\| (.*) \|$", table, flags=re.M)
    return dict(rows)


def test_every_key_of_a_profile_has_one_row_that_says_what_it_does() -> None:
    rows = documented()
    code = keys(Profile)
    assert len(code) == len(set(code))
    assert sorted(set(code) - set(rows)) == [], "keys the doc lacks"
    assert sorted(set(rows) - set(code)) == [], "rows for keys the code lacks"
    assert [k for k, what in rows.items() if not what.strip()] == []


def test_the_docs_knob_examples_are_knobs_that_load() -> None:
    text = DOC.read_text().split("## Knobs", 1)[1]
    block = re.search(r"```yaml\n(.*?)```", text, flags=re.S)
    assert block is not None
    knobs = [KnobSpec.model_validate(k) for k in yaml.safe_load(block.group(1))["knobs"]]
    space = KnobSpace(knobs=tuple(knobs))
    rendered = space.render(space.default_config())
    assert "--chunked-prefill-size" in rendered.argv and rendered.env == {"NCCL_ALGO": "Ring"}
    assert rendered.json_fields["--speculative-config"]["model"] == "/models/r64"
