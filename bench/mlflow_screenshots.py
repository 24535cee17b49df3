"""Screenshots of the MLflow UI after a round, in headless Chromium (``make screenshots``).

A real ``mlflow server --serve-artifacts`` on a free port, a round of ``--budget`` experiments
on the embedded twin logging to it (a fresh ledger in a temporary folder), then four pages as
a person opens them: the experiments list, a round's parent run, one child run and that
child's artifacts. The PNGs go to ``--out`` (``docs/images``), where the
README shows them; look at them after a change to what the round logs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from mlflow.tracking import MlflowClient

from ledger.mlflow_sink import mlflow_experiment

CLUSTER = "twin-local"  # the embedded twin profile's cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"mlflow server exited with {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"mlflow server at {url} not healthy within {timeout:g}s")


def shoot(chromium: str, url: str, out: Path, size: str = "1500,950") -> None:
    """One page, rendered after its scripts ran (virtual time), as a PNG."""
    done = subprocess.run(
        [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--hide-scrollbars", f"--window-size={size}", "--virtual-time-budget=30000",
            f"--screenshot={out}", url,
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"chromium failed on {url}: {done.stderr[-1500:]}")
    print(f"wrote {out} ({out.stat().st_size} bytes): {url}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--budget", type=int, default=3)
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium: apt-get install chromium")
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orchestrate-shots-") as tmp:
        work = Path(tmp)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        server = subprocess.Popen(
            [
                sys.executable, "-m", "mlflow", "server",
                "--backend-store-uri", f"sqlite:///{work}/server.db",
                "--serve-artifacts", "--artifacts-destination", str(work / "served"),
                "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            ],
            cwd=work, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        try:
            wait_healthy(url, server)
            env = {
                **os.environ,
                "MLFLOW_TRACKING_URI": url,
                "ORCHESTRATE_LEDGER": f"sqlite:///{work}/orchestrate.db",
            }
            env.pop("ORCHESTRATE_ARTIFACTS", None)
            subprocess.run(
                [sys.executable, "-m", "orchestrator", "round", "--budget", str(args.budget)],
                cwd=work, env=env, check=True,
            )  # fmt: skip
            client = MlflowClient(url)
            experiment = client.get_experiment_by_name(mlflow_experiment(CLUSTER))
            assert experiment is not None, "the round logged no experiment"
            eid = experiment.experiment_id
            runs = client.search_runs([eid], order_by=["attributes.start_time ASC"])
            children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
            child = next(
                (r for r in children if r.data.tags.get("status") == "discard"), children[-1]
            )
            shoot(chromium, f"{url}/#/experiments", args.out / "mlflow-experiments.png")
            # the round's parent run: the round in numbers, its report and results.tsv
            parent = child.data.tags["mlflow.parentRunId"]
            shoot(
                chromium,
                f"{url}/#/experiments/{eid}/runs/{parent}",
                args.out / "mlflow-round.png",
                size="1500,1300",
            )
            # a child, named for its change and verdict, with its metrics and params
            shoot(
                chromium,
                f"{url}/#/experiments/{eid}/runs/{child.info.run_id}",
                args.out / "mlflow-child.png",
                size="1500,1300",
            )
            shoot(
                chromium,
                f"{url}/#/experiments/{eid}/runs/{child.info.run_id}/artifacts",
                args.out / "mlflow-child-artifacts.png",
            )
        finally:
            os.killpg(server.pid, 15)
            server.wait(timeout=30)


if __name__ == "__main__":
    main()
