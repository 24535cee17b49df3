"""Our bench client's decode tok/s against `vllm bench serve`'s, on one real vLLM server, with
the same prompts, in one run.

    .venv/bin/python -m bench.vllm_bench_compare [--concurrency 1 4] [--pairs 3]
        [--category code] [--requests 12] [--url http://127.0.0.1:8000]

Without ``--url`` it boots the champion of the ``vllm-cpu-smollm2`` profile (``make engines``
first) through the orchestrator's own deploy path, on a free port in a temporary directory,
and stops it at the end. For each concurrency it alternates the two clients (ours, theirs;
then theirs, ours; …) so that drift hits both alike, and prints every run, the per-pair
ratios and the ratio of the means (ours / theirs; the goal is within 3%). At each concurrency
a first `vllm bench serve` run over the same prompts warms the server up and is not counted
(the first pass over a prompt set runs measurably slower: prefix cache, allocations).

The same prompts: the bench cell's prompts (``cluster.prompts.build_prompt``) are written as a
ShareGPT-format file and sent by `vllm bench serve` raw (no chat template), greedy, with
``--ignore-eos`` and the cell's ``max_tokens`` as every request's output length, exactly as our
cells send them. `vllm bench serve` divides the tokens of ``--requests`` requests by its wall
time; our cell counts the tokens that arrive inside a window (after a warm-up) while keeping
``concurrency`` requests in flight, so the window is sized to what vLLM's run takes.
`vllm bench serve` runs through the engine's own `vllm` command (the install's wrapper, which
works around the vllm-cpu distribution's name).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from cluster.bench import run_cell
from cluster.deploy import Deployer
from cluster.prompts import build_prompt
from knobs.records import CellSpec
from orchestrator.engines import installed, layout
from orchestrator.profile import Profile, load_profile
from orchestrator.testbed import deployer_for
from tests.fixtures.ports import free_port


def boot(profile: Profile) -> Deployer:
    """The profile's champion, up and gated, through the orchestrator's deploy path."""
    deployer = deployer_for(profile, progress=lambda msg: print(f"  {msg}", file=sys.stderr))
    result = deployer.deploy(profile.initial_champion())
    print(f"  up in {result.boot_seconds:.0f}s", file=sys.stderr)
    return deployer


def sharegpt(path: Path, category: str, requests: int) -> list[str]:
    """The cell's first ``requests`` prompts as a ShareGPT file; their ids."""
    prompts = [build_prompt(category, 0, i) for i in range(requests)]
    path.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": p.text},
                        {"from": "gpt", "value": "-"},
                    ]
                }
                for p in prompts
            ]
        )
    )
    return [p.id for p in prompts]


def theirs(
    url: str, model: str, tokenizer: Path, data: Path, out: Path, *, conc: int, n: int, tokens: int
) -> dict[str, Any]:
    """One `vllm bench serve` run; its result JSON."""
    out.unlink(missing_ok=True)
    argv = [
        str(layout("vllm-cpu").cli), "bench", "serve",
        "--backend", "vllm", "--base-url", url, "--endpoint", "/v1/completions",
        "--model", model, "--served-model-name", model, "--tokenizer", str(tokenizer),
        "--dataset-name", "sharegpt", "--dataset-path", str(data), "--disable-shuffle",
        "--sharegpt-output-len", str(tokens), "--num-prompts", str(n),
        "--max-concurrency", str(conc), "--request-rate", "inf", "--ignore-eos",
        "--temperature", "0", "--num-warmups", str(conc), "--disable-tqdm",
        "--save-result", "--result-dir", str(out.parent), "--result-filename", out.name,
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def ours(url: str, model: str, category: str, *, conc: int, tokens: int, seconds: float) -> float:
    """One bench cell of ours, its window sized like vLLM's run; decode tok/s."""
    cell = CellSpec(
        name=f"{category}-c{conc}",
        category=category,
        concurrency=conc,
        max_tokens=tokens,
        warmup_s=2.0,
        duration_s=max(2.0, seconds),
    )
    return run_cell(url, model, cell).output_throughput


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; 0 when every ratio of means is within ``--goal`` percent, else 1."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.vllm_bench_compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", help="a running server (default: boot the profile's champion)")
    parser.add_argument("--profile", default="vllm-cpu-smollm2")
    parser.add_argument(
        "--category", default="code", choices=["prose", "code", "structured", "agentic"]
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=12, help="per vLLM run, times concurrency")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--goal", type=float, default=3.0, help="percent")
    parser.add_argument("--json", dest="as_json", help="write the results here too")
    args = parser.parse_args(argv)
    # a SIGTERM unwinds like Ctrl-C: the server this script booted is stopped on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    engine = layout("vllm-cpu")
    if not installed(engine):
        parser.error(f"the vllm-cpu engine is not installed at {engine.root}: run `make engines`")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="orchestrate-compare-") as tmp:
        work = Path(tmp)
        deployer: Deployer | None = None
        profile = load_profile(args.profile, base_dir=work)
        url = args.url
        if url is None:
            cluster = profile.cluster.model_copy(update={"port": free_port()})
            profile = profile.model_copy(update={"cluster": cluster})
            url = profile.cluster.base_url
            print(f"booting the {profile.name} champion at {url}", file=sys.stderr)
            deployer = boot(profile)
        try:
            for conc in args.concurrency:
                n = args.requests * conc
                data = work / f"prompts-{args.category}-{n}.json"
                ids = sharegpt(data, args.category, n)
                # the first pass over the prompts runs cold (vLLM's prefix cache, allocations):
                # one uncounted `vllm bench serve` run over them at this concurrency first
                warm = theirs(url, profile.model, engine.model, data, work / "result.json",
                              conc=conc, n=n, tokens=args.max_tokens)  # fmt: skip
                print(
                    f"  c{conc} warm-up: vllm bench serve {warm['output_throughput']:.1f} tok/s "
                    "(not counted)",
                    file=sys.stderr,
                )
                mine: list[float] = []
                vllms: list[float] = []
                for pair in range(args.pairs):
                    order = ("ours", "theirs") if pair % 2 == 0 else ("theirs", "ours")
                    for who in order:
                        if who == "theirs":
                            result = theirs(
                                url,
                                profile.model,
                                engine.model,
                                data,
                                work / "result.json",
                                conc=conc,
                                n=n,
                                tokens=args.max_tokens,
                            )
                            vllms.append(float(result["output_throughput"]))
                            seconds = float(result["duration"])
                            print(
                                f"  c{conc} pair {pair + 1}: vllm bench serve "
                                f"{vllms[-1]:.1f} tok/s ({result['completed']} requests, "
                                f"{seconds:.1f}s)",
                                file=sys.stderr,
                            )
                        else:
                            # the window: what vLLM's last run (or the warm-up) took
                            seconds = (
                                float(rows[-1]["seconds"]) if rows and rows[-1]["c"] == conc
                                else float(warm["duration"])
                            )  # fmt: skip
                            mine.append(
                                ours(
                                    url,
                                    profile.model,
                                    args.category,
                                    conc=conc,
                                    tokens=args.max_tokens,
                                    seconds=seconds,
                                )
                            )
                            print(
                                f"  c{conc} pair {pair + 1}: ours {mine[-1]:.1f} tok/s "
                                f"({seconds:.1f}s window)",
                                file=sys.stderr,
                            )
                        rows.append({"c": conc, "who": who, "seconds": seconds})
                pairs = [a / b for a, b in zip(mine, vllms, strict=True)]
                ratio = statistics.fmean(mine) / statistics.fmean(vllms)
                rows.append(
                    {
                        "c": conc,
                        "who": "summary",
                        "seconds": 0.0,
                        "ours": mine,
                        "vllm": vllms,
                        "pair_ratios": pairs,
                        "ratio": ratio,
                        "prompts": ids[: len(set(ids))],
                    }
                )
        finally:
            if deployer is not None:
                deployer.stop_all()
                deployer.close()
    summaries = [r for r in rows if r["who"] == "summary"]
    print(f"\n{'concurrency':>11} {'ours tok/s':>11} {'vllm tok/s':>11} {'ratio':>7}  per pair")
    ok = True
    for s in summaries:
        within = abs(s["ratio"] - 1) * 100 <= args.goal
        ok = ok and within
        print(
            f"{s['c']:>11} {statistics.fmean(s['ours']):>11.1f} "
            f"{statistics.fmean(s['vllm']):>11.1f} "
            f"{s['ratio']:>7.3f}  "
            + " ".join(f"{r:.3f}" for r in s["pair_ratios"])
            + ("" if within else f"  (outside {args.goal:g}%)")
        )
    if args.as_json:
        Path(args.as_json).write_text(json.dumps(summaries, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
