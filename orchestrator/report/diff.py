"""The report's launcher diff: the head node's launcher for the round's last champion against
the one it started from."""

from __future__ import annotations

import difflib

from cluster.launcher import render_node
from knobs.config import Config
from knobs.errors import KnobError, ProfileError
from knobs.spec import Value, as_text
from orchestrator.profile import Profile
from orchestrator.settings import runtime_placeholders


def launcher_diff(profile: Profile, start: Config | None, end: Config | None) -> str:
    """The head node's launcher for the round's last champion against its first (a unified
    diff; the knob changes alone when the launchers cannot be rendered here)."""
    if start is None or end is None:
        return ""
    if start.key == end.key:
        return ""
    head = profile.cluster.head
    try:
        runtime = runtime_placeholders()
        old = render_node(profile.launcher, profile.space, start, profile.cluster, head, runtime)
        new = render_node(profile.launcher, profile.space, end, profile.cluster, head, runtime)
    except (ProfileError, KnobError):
        changed = [k for k in end if start.get(k) != end.get(k)]
        return "\n".join(
            f"{k}: {_text(start.get(k))} → {_text(end.get(k))}" for k in sorted(changed)
        )
    return "".join(
        difflib.unified_diff(
            old.script.splitlines(keepends=True),
            new.script.splitlines(keepends=True),
            fromfile="starting champion",
            tofile="champion",
        )
    )


def _text(value: Value | None) -> str:
    return "(none)" if value is None else as_text(value)
