"""Knob catalogs for the stacks in the seed cards; a profile picks one and may override it."""

from __future__ import annotations

from knobs.errors import KnobError
from knobs.spec import EffectPrior, KnobSpec, RenderSpec

VLLM_DFLASH2: tuple[KnobSpec, ...] = (
    KnobSpec(
        name="num_speculative_tokens",
        type="int",
        low=1,
        high=7,
        default=7,
        description="K: draft tokens proposed per verify step",
        role="draft_tokens",
        # the best K moves with a verify step's cost and with the drafter's acceptance
        interacts_with=("cuda_graphs", "drafter_adapter_rank"),
        render=RenderSpec(
            kind="json_field", flag="--speculative-config", field="num_speculative_tokens"
        ),
        effect_prior=EffectPrior(
            p_null=0.05,
            effect_pct=15.0,
            source="K sets the accepted tokens per step and the verify step's cost: it moved "
            "throughput on every stack measured (K=2 best on one EXL3 TP4 stack; structured "
            "output gains from a large K, prose loses)",
        ),
    ),
    KnobSpec(
        name="max_num_batched_tokens",
        type="int",
        low=2048,
        high=16384,
        step=512,
        default=7168,
        description="MNBT: tokens per scheduler step; bounds prefill chunks",
        render=RenderSpec(kind="flag", flag="--max-num-batched-tokens"),
        # a long prompt past the TTFT guardrail at one MNBT takes more prefill steps at a
        # smaller one
        monotone_guardrails={"ttft-guardrail": "below"},
        effect_prior=EffectPrior(
            p_null=0.7,
            effect_pct=15.0,
            source="7168 fixed an 8k-prefill cliff on one stack; other sweeps were flat",
        ),
    ),
    KnobSpec(
        name="cuda_graphs",
        type="bool",
        default=False,
        description="CUDA graph capture; off renders --enforce-eager",
        render=RenderSpec(kind="switch", when_false=("--enforce-eager",)),
        effect_prior=EffectPrior(
            p_null=0.05,
            effect_pct=15.0,
            source="-10 to -20 % on one TP4 stack, +11 to +13 % on another: never nothing, "
            "either sign",
        ),
    ),
    KnobSpec(
        name="drafter_adapter_rank",
        type="choice",
        choices=(0, 16, 32, 64, 128),
        default=64,
        description="rank of the drafter's merged adapter; 0 is the stock drafter",
        render=RenderSpec(
            kind="json_field",
            flag="--speculative-config",
            field="model",
            values={
                "0": "/models/dflash2-stock",
                "16": "/models/dflash2-r16",
                "32": "/models/dflash2-r32",
                "64": "/models/dflash2-r64",
                "128": "/models/dflash2-r128",
            },
        ),
        effect_prior=EffectPrior(
            p_null=0.7,
            effect_pct=15.0,
            source="a rank-64 adapter raised teacher-forced top-1 (0.57 -> 0.64) and gave no "
            "served gain",
        ),
    ),
    KnobSpec(
        name="kv_cache_dtype",
        type="choice",
        choices=("auto", "fp8_e4m3", "fp8_e5m2"),
        default="fp8_e4m3",
        description="KV cache element type",
        render=RenderSpec(kind="flag", flag="--kv-cache-dtype"),
    ),
    KnobSpec(
        name="gpu_memory_utilization",
        type="float",
        low=0.70,
        high=0.95,
        step=0.01,
        default=0.85,
        description="fraction of device memory the engine may take (0.89+ ran out of memory)",
        render=RenderSpec(kind="flag", flag="--gpu-memory-utilization"),
        # more memory than the device has fails at every larger fraction too; too little left
        # for the KV cache fails at every smaller one
        monotone_failures={"oom": "above", "kv_capacity": "below"},
    ),
)

CATALOGS: dict[str, tuple[KnobSpec, ...]] = {"vllm-dflash2": VLLM_DFLASH2}


def catalog(name: str) -> tuple[KnobSpec, ...]:
    """The knob specs of catalog ``name``.

    Raises:
        KnobError: no such catalog.
    """
    try:
        return CATALOGS[name]
    except KeyError:
        known = ", ".join(sorted(CATALOGS))
        raise KnobError(f"unknown knob catalog {name!r}; known: {known}") from None
