"""The digital twin: a vLLM-like engine per node whose performance comes from a landscape.

``python -m cluster.twin serve MODEL [vllm serve flags]`` runs one node; ``cluster.twin.landscape``
holds the model and its ground truth; docs/twin.md documents both.
"""

from __future__ import annotations

from pathlib import Path

#: Regex of the line a headless rank prints when it is up and connecting to the master.
WORKER_READY_LINE = r"Headless node rank (\d+) ready, waiting for master (\S+):(\d+)"

#: Regex of the line rank 0 prints when its boot is complete (/health answers 200 from then on).
HEAD_READY_LINE = r"Application startup complete\."

#: The drafter mask-embedding line a good DFlash boot prints (card 000's boot-log gate).
MASK_EMBEDDING_LINE = (
    r"Loaded DFlash mask embedding for mask_token_id (\d+) from mask_embedding\.pt"
)


def models_dir() -> Path:
    """The directory of the twin's drafter directories (``dflash2-stock``, ``dflash2-r64``, …)."""
    return Path(__file__).resolve().parent / "models"


__all__ = ["HEAD_READY_LINE", "MASK_EMBEDDING_LINE", "WORKER_READY_LINE", "models_dir"]
