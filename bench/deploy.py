"""Wall time of a 4-node deploy over SSH, parallel (as shipped) against a fully sequential
baseline, measured in one run on the same test hosts.

    .venv/bin/python -m bench.deploy [--nodes 4] [--repeats 3]

It starts real sshd test hosts (``tests/fixtures/sshd.py``: network namespaces as root, else
127.0.0.x), deploys the twin's champion through the SSH transport, alternating the two modes
so that drift hits both alike, and tears everything down. "Sequential" runs every per-node
step one node at a time (connections, preflight gates, uploads, log reads); what is
sequential by design (stops head first, workers N-1…1 each confirmed before the head) is the
same in both. Each deploy starts from fresh connections, as ``orchestrate cluster up`` does.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cluster.deploy import Deployer
from orchestrator.profile import Profile, load_profile
from orchestrator.testbed import deployer_for
from tests.fixtures.profiles import write_profile
from tests.fixtures.sshd import ssh_hosts

#: Phases of a deploy, each beginning with the first progress message that starts with it.
PHASES = (
    ("connect", ""),
    ("stop all", "stopping node-0"),
    ("preflight", "preflight"),
    ("upload", "uploading"),
    ("workers", "starting node-"),
    ("head to /health", "starting node-0"),
    ("smoke and log gates", "smoke generation"),
)


def deployer(profile: Profile, *, parallel: bool, progress: Any = None) -> Deployer:
    """A deployer with fresh SSH connections to every node."""
    return deployer_for(profile, progress=progress, parallel=parallel)


def one(profile: Profile, *, parallel: bool) -> tuple[float, dict[str, float]]:
    """Seconds for one deploy of the champion, and per phase (torn down afterwards)."""
    marks: list[tuple[float, str]] = []
    d = deployer(profile, parallel=parallel, progress=lambda m: marks.append((time.monotonic(), m)))
    try:
        started = time.monotonic()
        d.deploy(profile.initial_champion())
        ended = time.monotonic()
    finally:
        d.teardown()
        d.close()
    begins = [started]
    for _, prefix in PHASES[1:]:
        begins.append(next(t for t, m in marks if m.startswith(prefix) and t >= begins[-1]))
    if len(profile.cluster.nodes) == 1:
        begins[4] = begins[5]
    phases = {
        name: end - begin
        for (name, _), begin, end in zip(PHASES, begins, [*begins[1:], ended], strict=True)
    }
    return ended - started, phases


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and print it; exit status 0."""
    parser = argparse.ArgumentParser(prog="python -m bench.deploy", description=__doc__)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-deploy-") as tmp, ssh_hosts(args.nodes) as c:
        profile = load_profile(str(write_profile(Path(tmp), c.profile_data())))
        print(f"{args.nodes} sshd test hosts ({c.mode}), twin champion, {args.repeats} pairs")
        times: dict[bool, list[float]] = {True: [], False: []}
        phases: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        one(profile, parallel=True)  # warm the page cache; not counted
        for i in range(args.repeats):
            for parallel in (False, True) if i % 2 else (True, False):
                seconds, split = one(profile, parallel=parallel)
                times[parallel].append(seconds)
                phases[parallel].append(split)
                mode = "parallel  " if parallel else "sequential"
                print(f"  run {i + 1} {mode} {seconds:6.2f} s", flush=True)
        print(f"{'median seconds':22} {'parallel':>10} {'sequential':>11}")
        for name, _ in PHASES:
            par = statistics.median(p[name] for p in phases[True])
            seq = statistics.median(p[name] for p in phases[False])
            print(f"  {name:20} {par:10.2f} {seq:11.2f}")
        par, seq = statistics.median(times[True]), statistics.median(times[False])
        print(f"  {'whole deploy':20} {par:10.2f} {seq:11.2f}")
        print(f"sequential / parallel = {seq / par:.2f}x (medians of {args.repeats} runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
