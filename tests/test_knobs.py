"""knobs: specs, validation of untrusted values, configs, changes, rendering."""

from __future__ import annotations

import pytest

from knobs import Change, Config, KnobError, KnobSpace, KnobSpec, RenderSpec, catalog
from knobs.space import ForbiddenCombination
from knobs.spec import clipped, printable

SPACE = KnobSpace(knobs=catalog("vllm-dflash2"))


def test_default_config_is_card_002_champion() -> None:
    config = SPACE.default_config()
    assert config["num_speculative_tokens"] == 7
    assert config["max_num_batched_tokens"] == 7168
    assert config["cuda_graphs"] is False
    assert config["drafter_adapter_rank"] == 64


def test_config_hash_ignores_order_and_distinguishes_types() -> None:
    a = Config({"x": 1, "y": True})
    b = Config({"y": True, "x": 1})
    c = Config({"y": 1, "x": 1})
    assert a == b and hash(a) == hash(b) and a.key == b.key
    assert a != c and a.key != c.key
    assert {a: "first"}[b] == "first"
    assert Config.from_json(a.to_json()) == a


@pytest.mark.parametrize(
    ("knob", "raw", "expected"),
    [
        ("num_speculative_tokens", "5", 5),
        ("num_speculative_tokens", 3, 3),
        ("num_speculative_tokens", 4.0, 4),
        ("max_num_batched_tokens", "8192", 8192),
        ("cuda_graphs", "on", True),
        ("cuda_graphs", False, False),
        ("drafter_adapter_rank", "128", 128),
        ("kv_cache_dtype", "auto", "auto"),
        ("gpu_memory_utilization", "0.8", 0.8),
        ("gpu_memory_utilization", 0.95, 0.95),
    ],
)
def test_parse_accepts_values_of_the_domain(knob: str, raw: object, expected: object) -> None:
    value = SPACE.spec(knob).parse(raw)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(
    ("knob", "raw"),
    [
        ("num_speculative_tokens", 0),
        ("num_speculative_tokens", 8),
        ("num_speculative_tokens", "7; reboot"),
        ("num_speculative_tokens", "$(id)"),
        ("num_speculative_tokens", "`id`"),
        ("num_speculative_tokens", "7\n8"),
        ("num_speculative_tokens", True),
        ("num_speculative_tokens", 2.5),
        ("max_num_batched_tokens", 7000),
        ("max_num_batched_tokens", 1024),
        ("cuda_graphs", "maybe"),
        ("cuda_graphs", 1),
        ("drafter_adapter_rank", 48),
        ("kv_cache_dtype", "fp8'; rm -rf /"),
        ("gpu_memory_utilization", 0.965),
        ("gpu_memory_utilization", float("nan")),
        ("gpu_memory_utilization", "1e400"),
    ],
)
def test_parse_rejects_values_outside_the_domain(knob: str, raw: object) -> None:
    with pytest.raises(KnobError) as info:
        SPACE.spec(knob).parse(raw)
    assert info.value.knob == knob
    assert knob in str(info.value)
    assert "\n" not in str(info.value)


def test_unknown_knob_names_the_known_ones() -> None:
    with pytest.raises(
        KnobError, match=r"unknown knob 'num_spec_tokens'; known knobs: num_speculative_tokens"
    ):
        SPACE.change(SPACE.default_config(), "num_spec_tokens", 5)


def test_a_misspelt_knob_names_the_knob_it_is_a_typo_of() -> None:
    with pytest.raises(
        KnobError,
        match=r"unknown knob 'num_speculative_token'; did you mean num_speculative_tokens\? "
        r"\(known knobs: num_speculative_tokens, ",
    ):
        SPACE.change(SPACE.default_config(), "num_speculative_token", 5)


def test_change_is_exactly_one_knob_and_a_real_change() -> None:
    champion = SPACE.default_config()
    change = SPACE.change(champion, "num_speculative_tokens", "5")
    assert change == Change(knob="num_speculative_tokens", old=7, new=5)
    assert champion.apply(change).diff(champion) == ["num_speculative_tokens"]
    with pytest.raises(KnobError, match="already the champion's value"):
        SPACE.change(champion, "num_speculative_tokens", 7)


@pytest.mark.parametrize(
    "when",
    [
        {"cuda_graphs": True, "num_speculative_tokens": 7},
        # YAML's quoted values: kept as text, the rule never matched and protected nothing
        {"cuda_graphs": "true", "num_speculative_tokens": "7"},
    ],
)
def test_forbidden_combinations_are_refused_and_skipped(when: dict[str, object]) -> None:
    space = KnobSpace.model_validate(
        {"knobs": catalog("vllm-dflash2"), "forbidden": [{"when": when, "reason": "trap"}]}
    )
    champion = space.default_config()
    with pytest.raises(
        KnobError, match="forbidden combination cuda_graphs=true, num_speculative_tokens=7: trap"
    ):
        space.change(champion, "cuda_graphs", True)
    assert all(c.knob != "cuda_graphs" for c in space.neighbours(champion))
    assert space.forbidden == (
        ForbiddenCombination(
            when={"cuda_graphs": True, "num_speculative_tokens": 7}, reason="trap"
        ),
    )


def test_neighbours_cover_every_other_value_once() -> None:
    champion = SPACE.default_config()
    neighbours = SPACE.neighbours(champion)
    expected = sum(len(k.domain()) - 1 for k in SPACE.knobs)
    assert len(neighbours) == expected
    assert len({(c.knob, str(c.new)) for c in neighbours}) == expected


def test_render_places_each_knob_where_the_launcher_expects_it() -> None:
    rendered = SPACE.render(SPACE.default_config())
    argv = list(rendered.argv)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "7168"
    assert "--enforce-eager" in argv
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.85"
    assert rendered.json_fields["--speculative-config"] == {
        "num_speculative_tokens": 7,
        "model": "/models/dflash2-r64",
    }
    graphs = SPACE.render(SPACE.config({"cuda_graphs": True}, partial=True))
    assert "--enforce-eager" not in graphs.argv


def test_a_partial_values_map_renders_its_unlisted_values_as_themselves() -> None:
    """docs/profile.md: ``render.values`` maps the values it lists; the others render as
    themselves (an engine's backend renamed in one release, the rest as they are)."""
    moe = KnobSpec(
        name="moe_backend",
        type="choice",
        choices=("triton", "cutlass", "flashinfer"),
        default="triton",
        render=RenderSpec(
            kind="flag", flag="--moe-backend", values={"triton": "triton", "cutlass": "cutlass_v2"}
        ),
    )
    space = KnobSpace(knobs=(moe,))
    assert [moe.rendered(v) for v in moe.domain()] == ["triton", "cutlass_v2", "flashinfer"]
    flashinfer = space.render(space.config({"moe_backend": "flashinfer"}))
    assert flashinfer.argv == ("--moe-backend", "flashinfer")


def test_a_default_written_as_text_is_the_value_it_names() -> None:
    """YAML's quoted ``default: "false"`` on a bool switch deployed CUDA graphs ON (the text
    is true); ``default: "7168"`` put a text in an int knob's config, which hashes apart from
    the typed 7168 a proposal makes."""
    graphs = KnobSpec(
        name="graphs",
        type="bool",
        default="false",
        render=RenderSpec(kind="switch", when_false=("--enforce-eager",)),
    )
    chunk = KnobSpec(
        name="chunk",
        type="int",
        low=1024,
        high=16384,
        step=1024,
        default="7168",
        render=RenderSpec(kind="flag", flag="--chunk"),
    )
    assert graphs.default is False and chunk.default == 7168 and type(chunk.default) is int
    space = KnobSpace(knobs=(graphs, chunk))
    config = space.default_config()
    assert "--enforce-eager" in space.render(config).argv
    assert config == space.config({"graphs": False, "chunk": 7168})
    # a choice knob's text default stays the text it is
    assert SPACE.spec("kv_cache_dtype").default == "fp8_e4m3"


def test_a_values_key_is_read_as_the_value_it_names_and_one_naming_none_is_refused() -> None:
    """``values: {"1.00": /m/r64}`` was never matched (the lookup spells 1.0 as ``1``), so the
    engine got ``model: 1.0``, a path that does not exist, and the boot failed as the config's;
    a key naming no value of the domain loaded silently."""

    def drafter(values: dict[str, object]) -> KnobSpec:
        return KnobSpec.model_validate(
            {
                "name": "drafter",
                "type": "choice",
                "choices": [0.5, 1.0],
                "default": 1.0,
                "render": {"kind": "flag", "flag": "--model", "values": values},
            }
        )

    spelt = drafter({"0.50": "/m/r32", "1.00": "/m/r64"})
    assert [spelt.rendered(v) for v in spelt.domain()] == ["/m/r32", "/m/r64"]
    kv = {"name": "kv", "type": "choice", "choices": ["auto", "fp8_e4m3"], "default": "auto"}
    with pytest.raises(ValueError, match=r"key 'autoo' is not one of auto, fp8_e4m3; did you"):
        KnobSpec.model_validate({**kv, "render": {"kind": "flag", "flag": "--kv", "values": {
            "autoo": "bfloat16"}}})  # fmt: skip
    # a catalog's map under a domain a profile narrowed: its other keys name nothing here
    narrowed = drafter({"0.5": "/m/r32", "1.0": "/m/r64", "2.0": "/m/r128"})
    assert narrowed.rendered(1.0) == "/m/r64"
    with pytest.raises(ValueError, match=r"render.values names 1 of knob drafter twice"):
        drafter({"1": "/m/a", "1.00": "/m/b"})


def test_specs_refuse_unsafe_tokens_and_bad_domains() -> None:
    with pytest.raises(ValueError, match="not a safe token"):
        KnobSpec(
            name="x",
            type="choice",
            choices=("a b",),
            default="a b",
            render=RenderSpec(kind="flag", flag="--x"),
        )
    with pytest.raises(ValueError, match="cannot take"):
        RenderSpec(kind="flag", flag="--x; id")
    with pytest.raises(ValueError, match="needs a step"):
        KnobSpec(
            name="x",
            type="float",
            low=0,
            high=1,
            default=0.5,
            render=RenderSpec(kind="flag", flag="--x"),
        )
    with pytest.raises(KnobError):
        KnobSpec(
            name="x",
            type="int",
            low=1,
            high=3,
            default=9,
            render=RenderSpec(kind="flag", flag="--x"),
        )


def test_monotone_failures_need_an_ordered_knob_and_a_configs_failure_class() -> None:
    (spec,) = [k for k in catalog("vllm-dflash2") if k.name == "gpu_memory_utilization"]
    assert spec.monotone_failures == {"oom": "above", "kv_capacity": "below"}
    numeric_choice = KnobSpec(
        name="x",
        type="choice",
        choices=(256, 512),
        default=256,
        render=RenderSpec(kind="flag", flag="--x"),
        monotone_failures={"oom": "above"},
    )
    assert numeric_choice.ordered
    with pytest.raises(ValueError, match="needs a numeric knob"):
        KnobSpec(
            name="x",
            type="choice",
            choices=("a", "b"),
            default="a",
            render=RenderSpec(kind="flag", flag="--x"),
            monotone_failures={"oom": "above"},
        )
    with pytest.raises(ValueError, match="is not a failure class; known for a config: start"):
        KnobSpec(
            name="x",
            type="int",
            low=1,
            high=3,
            default=1,
            render=RenderSpec(kind="flag", flag="--x"),
            monotone_failures={"Out Of Memory": "above"},
        )


def test_monotone_guardrails_need_an_ordered_knob_and_a_guardrail_rule() -> None:
    (spec,) = [k for k in catalog("vllm-dflash2") if k.name == "max_num_batched_tokens"]
    assert spec.monotone_guardrails == {"ttft-guardrail": "below"}
    with pytest.raises(ValueError, match="monotone_guardrails needs a numeric knob"):
        KnobSpec(
            name="x",
            type="bool",
            default=False,
            render=RenderSpec(kind="switch", when_true=("--x",)),
            monotone_guardrails={"ttft-guardrail": "below"},
        )
    # only the verdict's guardrails can be declared: a misspelt rule is refused, not ignored
    with pytest.raises(ValueError, match="ttft-guardrail"):
        KnobSpec.model_validate(
            {
                "name": "x",
                "type": "int",
                "low": 1,
                "high": 3,
                "default": 1,
                "render": {"kind": "flag", "flag": "--x"},
                "monotone_guardrails": {"ttft": "below"},
            }
        )


def test_unknown_catalog() -> None:
    with pytest.raises(KnobError, match="unknown knob catalog 'nope'"):
        catalog("nope")


def test_a_value_is_printed_as_a_profile_spells_it() -> None:
    """Booleans and nothing as YAML writes them, never Python's spelling; a string quoted."""
    assert [printable(v) for v in (False, True, None, 3, 0.85, "fp8")] == [
        "false",
        "true",
        "null",
        "3",
        "0.85",
        "'fp8'",
    ]
    with pytest.raises(KnobError, match=r"^knob num_speculative_tokens: true is not "):
        SPACE.spec("num_speculative_tokens").parse(True)


def test_a_long_text_is_cut_at_a_word_and_says_it_was_cut() -> None:
    """What a line shows of a crash's message or a reason: never cut mid-word, never taken for
    the whole (``clipped``, for every line and tag that bounds a text)."""
    text = "CUDA out of memory: tried to allocate 2.50 GiB while 1.07 GiB free on device 0"
    assert clipped(text, 200) == text
    assert clipped(text, 40) == "CUDA out of memory: tried to allocate…"
    assert len(clipped(text, 40)) <= 40
    # one word longer than the room: cut inside it, still marked
    assert clipped("x" * 50, 10) == "x" * 9 + "…"
    assert printable("word " * 30) == "'word word word word word word word word word word word…"
