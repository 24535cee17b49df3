"""Which catalog knobs a `vllm serve` command sets, read back through each knob's render rule
(``knobs.spec.RenderSpec``): a ``flag``'s value, a ``switch``'s tokens, a ``json_field`` inside
its JSON flag, an ``env`` variable. What a knob renders is taken out of the command; what is
left is kept fixed. A value vLLM takes as another spelling of one of the knob's values
(``ENGINE_READS``) is that value. A knob the command does not set, or sets to a value outside
its domain, is left untuned: one it sets with the reason (``untuned``), one it does not set by
name alone (``unset``: the engine's default stands, nothing to say of it)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from knobs.errors import KnobError
from knobs.spec import KnobSpec, Value, as_text
from orchestrator.adopt.serve import Option, Serve

#: The values vLLM reads as another spelling of a catalog value, by flag: its CacheConfig takes
#: ``--kv-cache-dtype fp8`` as ``fp8_e4m3`` (on CUDA and ROCm alike). The knob takes the value
#: it names, and the profile renders that spelling from then on.
ENGINE_READS: dict[str, dict[str, str]] = {"--kv-cache-dtype": {"fp8": "fp8_e4m3"}}


@dataclass
class Recognised:
    """The knobs found (the champion), the knobs the launcher sets but that are left untuned
    (with why), the knobs it does not set (untuned too), the options left fixed, the JSON
    flags' fixed fields, and the environment a knob does not render."""

    champion: dict[str, Value] = field(default_factory=dict)
    #: a knob the launcher sets to what the catalog cannot tune from: why, where it is set
    untuned: dict[str, str] = field(default_factory=dict)
    #: the catalog's knobs the launcher does not set (the engine's default stands)
    unset: list[str] = field(default_factory=list)
    options: list[Option] = field(default_factory=list)
    json_flags: dict[str, dict[str, Value]] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    #: the knobs whose value the command spells as vLLM reads it (``ENGINE_READS``): their flag
    #: and that spelling
    read_as: dict[str, tuple[str, str]] = field(default_factory=dict)


def recognise(specs: tuple[KnobSpec, ...], serve: Serve, env: dict[str, str]) -> Recognised:
    """The catalog's ``specs`` read out of ``serve`` and its environment ``env``.

    Raises:
        KnobError: a JSON flag a knob writes into that is not a JSON object.
    """
    out = Recognised(options=list(serve.options), env=dict(env))
    objects: dict[str, dict[str, Value]] = {}
    for spec in specs:
        how = spec.render
        if how.kind == "json_field":
            assert how.flag is not None and how.field is not None
            if how.flag not in objects:
                objects[how.flag] = _json_object(serve, how.flag)
            obj = objects[how.flag]
            if how.field in obj:
                found = _value(spec, obj[how.field])
                if found is not None:
                    out.champion[spec.name] = found
                    del obj[how.field]
                    continue
                out.untuned[spec.name] = _outside(spec, f"{how.flag}'s {how.field}", obj[how.field])
            else:
                out.unset.append(spec.name)
        elif how.kind == "flag":
            assert how.flag is not None
            given = serve.get(how.flag)
            if given is None:
                out.unset.append(spec.name)
                continue
            found = _value(spec, given)
            meant = ENGINE_READS.get(how.flag, {}).get(given.strip())
            if found is None and meant is not None:
                found = _value(spec, meant)
                if found is not None:
                    out.read_as[spec.name] = (how.flag, given.strip())
            if found is None:
                out.untuned[spec.name] = _outside(spec, how.flag, given)
                continue
            out.champion[spec.name] = found
            out.options = [o for o in out.options if o.flag != how.flag]
        elif how.kind == "env":
            assert how.env is not None
            if how.env not in out.env:
                out.unset.append(spec.name)
                continue
            found = _value(spec, out.env[how.env])
            if found is None:
                out.untuned[spec.name] = _outside(spec, f"${how.env}", out.env[how.env])
                continue
            out.champion[spec.name] = found
            del out.env[how.env]
        else:
            _switch(spec, out)
    for flag, obj in objects.items():
        if serve.has(flag) and _knob_fields(specs, flag) & set(out.champion):
            out.json_flags[flag] = obj
            out.options = [o for o in out.options if o.flag != flag]
    return out


def _switch(spec: KnobSpec, out: Recognised) -> None:
    """A switch: its tokens (``--enforce-eager`` for CUDA graphs off) and variables."""
    how = spec.render
    flags = {o.flag for o in out.options if o.value is None}
    on = bool(how.when_true) and set(how.when_true) <= flags
    off = bool(how.when_false) and set(how.when_false) <= flags
    env_on = bool(how.env_when_true) and how.env_when_true.items() <= out.env.items()
    env_off = bool(how.env_when_false) and how.env_when_false.items() <= out.env.items()
    if (on or env_on) and (off or env_off):
        variables = {**how.env_when_true, **how.env_when_false}
        both = [*how.when_true, *how.when_false, *(f"{k}={v}" for k, v in variables.items())]
        out.untuned[spec.name] = f"the launcher has the tokens of both values ({' '.join(both)})"
        return
    if on or env_on:
        value = True
    elif off or env_off:
        value = False
    elif (how.when_false or how.env_when_false) and not (how.when_true or how.env_when_true):
        value = True  # only "off" writes anything: its absence is "on"
    elif (how.when_true or how.env_when_true) and not (how.when_false or how.env_when_false):
        value = False
    else:
        out.unset.append(spec.name)
        return
    out.champion[spec.name] = value
    tokens = set(how.when_true if value else how.when_false)
    out.options = [o for o in out.options if not (o.value is None and o.flag in tokens)]
    for name in how.env_when_true if value else how.env_when_false:
        out.env.pop(name, None)


def _json_object(serve: Serve, flag: str) -> dict[str, Value]:
    text = serve.get(flag)
    if text is None:
        return {}
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise KnobError(f"{flag} is not JSON ({e.msg}): {text[:60]!r}") from None
    if not isinstance(obj, dict):
        raise KnobError(f"{flag} is not a JSON object: {text[:60]!r}")
    return obj


def _knob_fields(specs: tuple[KnobSpec, ...], flag: str) -> set[str]:
    return {s.name for s in specs if s.render.kind == "json_field" and s.render.flag == flag}


def _value(spec: KnobSpec, raw: object) -> Value | None:
    """``raw`` (as the launcher has it) as the knob's value, or None when no value of the
    domain renders so."""
    if spec.render.values is not None:
        for key, shown in spec.render.values.items():
            if as_text(shown) == _text(raw):
                try:
                    return spec.parse(key)
                except KnobError:
                    return None
        return None
    try:
        return spec.parse(raw if not isinstance(raw, str) else raw.strip())
    except KnobError:
        return None


def _outside(spec: KnobSpec, where: str, raw: object) -> str:
    """Why the launcher's ``raw`` at ``where`` (a flag, a JSON field, a variable) is no value
    of ``spec``'s domain."""
    if spec.render.values is not None:
        values = ", ".join(as_text(v) for v in spec.render.values)
        return f"{where} {_text(raw)} is none of what the catalog renders for {values}"
    return f"{where} {_text(raw)} is not {spec.describe_domain()}"


def _text(raw: object) -> str:
    if isinstance(raw, bool | int | float | str):
        return as_text(raw)
    return json.dumps(raw)
