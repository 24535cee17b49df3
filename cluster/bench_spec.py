"""A profile's ``bench`` section: how its cells are run, apart from what they measure (a cell's
own fields, ``knobs.records.CellSpec``, are what its readings are compared by; these are not).
``cluster.bench`` applies it; ``orchestrator.profile`` holds it as ``Profile.bench``."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

#: The profile key that sets how long a cell waits for a token, as a hung cell's line names it
#: (no word of a secret's name in it, ``ledger.redact``: a ``token_…`` key is recorded as
#: ``secret`` in a profile's revision, and a change of it could not be said).
HANG_SETTING: Final = "bench.hang_after_s"
#: Its default: the least a cell waits past its warm-up for a cold or quiet engine's token.
HANG_AFTER_S: Final = 60.0


class BenchSpec(BaseModel):
    """How a bench cell is run: ``orchestrate bench`` and a round's cells alike."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hang_after_s: float = Field(
        default=HANG_AFTER_S,
        gt=0,
        le=3600,
        description="how long, at least, a cell waits past its warm-up for an engine's first "
        "token, or for its next one once its tokens stopped, before it calls the engine hung "
        "(the config's bench_failed); a cell waits at least five times its warm-up and window "
        "too. Raise it for an engine slow to answer (a large model's first token after a cold "
        "start); it decides when a stall is a hang, not what a cell measures",
    )
