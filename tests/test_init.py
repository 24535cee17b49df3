"""``orchestrate init --from launcher.sh``: the seed cards' launcher lines and launchers written
like the ones users have become profiles that render the same command back.

Each launcher goes through the real CLI; the profile it writes is loaded as any profile is and
rendered by ``orchestrate cluster up --dry-run``; the command each node would run is read
back with ``shlex`` (not init's own reader) and compared, option by option, with the
launcher's line. vLLM's own parser checks the same commands in ``make test-real``
(``tests/test_real_profiles_parse.py``).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from orchestrator.profile import Profile, load_profile
from tests.fixtures.cli import orchestrate

LAUNCHERS = Path(__file__).parent / "fixtures" / "launchers"


def _init(cwd: Path, launcher: str, *args: str) -> tuple[Profile, str]:
    out = cwd / f"{Path(launcher).stem}.yaml"
    done = orchestrate(cwd, "init", "--from", str(LAUNCHERS / launcher), "--out", str(out), *args)
    assert done.returncode == 0, done.stderr
    return load_profile(str(out)), done.stdout


def _commands(cwd: Path, profile: str) -> dict[str, list[str]]:
    """``cluster up --dry-run``'s command for each node, read back with ``shlex``."""
    done = orchestrate(cwd, "cluster", "up", "--dry-run", "--profile", profile)
    assert done.returncode == 0, done.stderr
    out: dict[str, list[str]] = {}
    for block in done.stdout.split("# node-")[1:]:
        name = "node-" + block.split(" ", 1)[0]
        exec_line = block[block.index("\nexec ") + 6 :].split("\n\n")[0].split("\n# ")[0]
        out[name] = shlex.split(exec_line.replace("\\\n", " "))
    return out


def _options(words: list[str]) -> list[str]:
    """The options after the model, as ``flag=value`` sorted, JSON and numbers normalised."""
    out = []
    i = 0
    while i < len(words):
        word = words[i]
        flag, sep, value = word.partition("=")
        if not sep and i + 1 < len(words) and not words[i + 1].startswith("--"):
            value, i = words[i + 1], i + 1
        if value.startswith("{"):
            value = json.dumps(json.loads(value), sort_keys=True)
        elif re.fullmatch(r"[0-9]+(\.[0-9]+)?", value):
            value = f"{float(value):g}"
        out.append(f"{flag}={value}")
        i += 1
    return sorted(out)


def _after_model(words: list[str], model: str) -> list[str]:
    return words[words.index(model) + 1 :]


def test_seed_card_000s_line_renders_back_the_same_command(tmp_path: Path) -> None:
    profile, said = _init(tmp_path, "card000-x86.sh")
    assert "2 knob(s) recognised (num_speculative_tokens=7, cuda_graphs=true)" in said
    assert profile.initial_champion().as_dict() == {
        "num_speculative_tokens": 7,
        "cuda_graphs": True,
    }
    assert set(profile.untuned) == {
        "max_num_batched_tokens",
        "drafter_adapter_rank",  # the card's drafter path is none of the catalog's ranks
        "kv_cache_dtype",
        "gpu_memory_utilization",
    }
    line = " ".join(
        t for t in (LAUNCHERS / "card000-x86.sh").read_text().splitlines() if not t.startswith("#")
    )
    card = shlex.split(line.replace("\\", " "))
    rendered = _commands(tmp_path, str(tmp_path / "card000-x86.yaml"))["node-0"]
    assert rendered[:3] == card[:3] == ["vllm", "serve", "/models/glm53-flash-w4a16-mtp"]
    model = card[2]
    assert _options(_after_model(rendered, model)) == _options(_after_model(card, model))
    assert profile.gates.must_log == ("Loaded DFlash mask embedding for mask_token_id",)
    assert profile.model == "glm53" and profile.cluster.nodes[0].transport == "local"


def test_card_002s_four_node_docker_launcher_renders_each_ranks_command(tmp_path: Path) -> None:
    hosts = [f"192.168.100.{i}" for i in (11, 12, 13, 14)]
    profile, _ = _init(tmp_path, "card002-v5-tp4.sh", "--nodes", ",".join(hosts))
    assert profile.initial_champion().as_dict() == {
        "num_speculative_tokens": 7,
        "max_num_batched_tokens": 7168,
        "cuda_graphs": False,
        "drafter_adapter_rank": 64,
        "kv_cache_dtype": "fp8_e4m3",
        "gpu_memory_utilization": 0.85,
    }
    assert not profile.untuned
    assert [n.host for n in profile.cluster.nodes] == hosts
    assert all(
        n.transport == "ssh" and n.ssh and n.ssh.host == n.host for n in profile.cluster.nodes
    )
    # the environment kept: VLLM_HOST_IP (a command substitution in the script) is the node's
    assert profile.launcher.env == {
        "VLLM_HOST_IP": "{host}",
        "NCCL_SOCKET_IFNAME": "enP7s7",
        "GLOO_SOCKET_IFNAME": "enP7s7",
        "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
    }
    assert profile.gates.stop_hook == ("docker", "stop", "-t", "30", "glm53-tp4")
    commands = _commands(tmp_path, str(tmp_path / "card002-v5-tp4.yaml"))
    assert list(commands) == ["node-3", "node-2", "node-1", "node-0"]  # workers first
    text = (LAUNCHERS / "card002-v5-tp4.sh").read_text()
    head_line, worker_line = (
        shlex.split(block.split("\nelse")[0].split("\nfi")[0].replace("\\\n", " "), comments=True)
        for block in text.split("then\n", 1)[1].split("else\n", 1)
    )
    for rank in range(4):
        line = head_line if rank == 0 else worker_line
        want = [
            w.replace("$RANK", str(rank))
            .replace("$HEAD_IP", hosts[0])
            .replace("$IMAGE", "vllm-glm53-sm121:v5")
            for w in line
        ]
        got = commands[f"node-{rank}"]
        assert "-d" not in got and got[:3] == ["docker", "run", "--rm"]
        model = "/models/GLM-5.3-Flash"
        assert got[: got.index(model)] == [w for w in want[: want.index(model)] if w != "-d"]
        assert _options(_after_model(got, model)) == _options(_after_model(want, model))


def test_a_head_line_alone_gives_headless_workers_and_an_odd_value_stays_fixed(
    tmp_path: Path,
) -> None:
    profile, said = _init(tmp_path, "sm121-tp2-head-only.sh", "--nodes", "10.0.0.1,10.0.0.2")
    assert "no --headless line" in said
    champion = profile.initial_champion().as_dict()
    assert champion == {
        "num_speculative_tokens": 5,
        "cuda_graphs": True,
        "gpu_memory_utilization": 0.8,
    }
    # 8000 is no value of MNBT's domain (steps of 512): not tuned, kept as written
    assert "max_num_batched_tokens" in profile.untuned
    written = (tmp_path / "sm121-tp2-head-only.yaml").read_text()
    assert (
        "# Untuned: max_num_batched_tokens: --max-num-batched-tokens 8000 is not an integer "
        "from 2048" in written
    )
    assert "# Dropped: docker run -dit" in written
    assert profile.cluster.port == 8001
    commands = _commands(tmp_path, str(tmp_path / "sm121-tp2-head-only.yaml"))
    head, worker = commands["node-0"], commands["node-1"]
    assert head[head.index("--max-num-batched-tokens") + 1] == "8000"
    assert "-e" in head and "VLLM_HOST_IP=10.0.0.1" in head and "VLLM_HOST_IP=10.0.0.2" in worker
    assert "--headless" in worker and "--headless" not in head
    assert "--port" in head and "--port" not in worker and "--host" not in worker
    assert worker[worker.index("--node-rank") + 1] == "1"
    # no --rm: the stop hook removes the container, or the next boot finds its name taken
    assert (
        profile.gates.stop_hook is not None and "docker rm glm53-tp2" in profile.gates.stop_hook[-1]
    )


def test_a_cpu_launcher_with_variables_and_exec(tmp_path: Path) -> None:
    profile, _ = _init(tmp_path, "vllm-cpu-ngram.sh")
    assert profile.initial_champion().as_dict() == {
        "num_speculative_tokens": 2,
        "max_num_batched_tokens": 2048,
        "cuda_graphs": False,
    }
    assert profile.launcher.env == {"VLLM_CPU_KVCACHE_SPACE": "4"}
    assert profile.launcher.json_flags == {
        "--speculative-config": {"method": "ngram", "prompt_lookup_max": 5, "prompt_lookup_min": 3}
    }
    got = _commands(tmp_path, str(tmp_path / "vllm-cpu-ngram.yaml"))["node-0"]
    assert got[:3] == ["/opt/vllm-cpu/bin/vllm", "serve", "/models/smollm2"]
    assert profile.cluster.port == 28180 and got[got.index("--port") + 1] == "28180"
    # a JSON flag no knob writes into is kept as written
    compilation = got[got.index("--compilation-config") + 1]
    assert json.loads(compilation) == {"cudagraph_capture_sizes": [1, 2, 4]}


@pytest.mark.parametrize(
    ("text", "line", "token"),
    [
        ('vllm serve /m \\\n  --speculative-config \'{"method":"ngram"}\n', 2, "'{"),
        ("IP=$(hostname -I)\nvllm serve /m --master-addr $IP\n", 2, "$IP"),
        ("vllm serve /m --speculative-config '{\"num_speculative_tokens\": 3' --port 1\n", 1, ""),
    ],
)
def test_a_launcher_it_cannot_read_is_one_line_naming_the_line_and_token(
    tmp_path: Path, text: str, line: int, token: str
) -> None:
    launcher = tmp_path / "run.sh"
    launcher.write_text(text)
    done = orchestrate(tmp_path, "init", "--from", str(launcher))
    assert done.returncode == 3, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ")
    if token:
        assert f"{launcher}:{line}: cannot read" in lines[0] and token in lines[0]
    else:
        assert "--speculative-config is not JSON" in lines[0]
    assert not list(tmp_path.glob("*.yaml"))


def test_what_init_refuses(tmp_path: Path) -> None:
    launcher = tmp_path / "run.sh"
    launcher.write_text("echo hello\n")
    done = orchestrate(tmp_path, "init", "--from", str(launcher))
    assert done.returncode == 3 and "no `vllm serve` command" in done.stderr
    assert "written by hand: docs/profile.md" in done.stderr
    binary = tmp_path / "engine.bin"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe")
    done = orchestrate(tmp_path, "init", "--from", str(binary))
    assert done.returncode == 3 and "not a launcher script (not UTF-8 text" in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    nowhere = tmp_path / "no" / "such.yaml"
    done = orchestrate(
        tmp_path, "init", "--from", str(LAUNCHERS / "vllm-cpu-ngram.sh"), "--out", str(nowhere)
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"the folder {nowhere.parent} does not exist; create it" in done.stderr
    launcher.write_text("vllm serve /m --nnodes 2 --node-rank 0 --master-addr 10.0.0.1\n")
    done = orchestrate(tmp_path, "init", "--from", str(launcher))
    assert done.returncode == 2 and "--nodes HEAD,WORKER" in done.stderr
    done = orchestrate(tmp_path, "init", "--from", str(launcher), "--nodes", "a,b,c")
    assert done.returncode == 2 and "the launcher runs 2" in done.stderr
    done = orchestrate(tmp_path, "init", "--from", str(launcher), "--nodes", "a,b")
    assert done.returncode == 0, done.stderr
    done = orchestrate(tmp_path, "init", "--from", str(launcher), "--nodes", "a,b")
    assert done.returncode == 2 and "exists" in done.stderr  # never overwritten unasked
    done = orchestrate(tmp_path, "init", "--from", str(launcher), "--nodes", "a,b c", "--force")
    assert done.returncode == 3 and "cluster.nodes.1.host" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    # a worker line that leaves out a knob the head sets: one champion cannot render both
    launcher.write_text(
        "vllm serve /m --nnodes 2 --node-rank 0 --master-addr 10.0.0.1 --enforce-eager\n"
        "vllm serve /m --nnodes 2 --node-rank 1 --master-addr 10.0.0.1 --headless\n"
    )
    done = orchestrate(tmp_path, "init", "--from", str(launcher), "--nodes", "a,b", "--force")
    assert done.returncode == 3, done.stderr
    assert f"{launcher}:2:" in done.stderr and "sets cuda_graphs to true" in done.stderr


def test_untuned_must_name_catalog_knobs(tmp_path: Path) -> None:
    profile, _ = _init(tmp_path, "card000-x86.sh")
    data = yaml.safe_load((tmp_path / "card000-x86.yaml").read_text())
    data["untuned"] = ["max_num_batched_token"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(data))
    done = orchestrate(tmp_path, "status", "--profile", str(tmp_path / "bad.yaml"))
    assert done.returncode == 3 and "untuned: 'max_num_batched_token' is not a knob" in done.stderr
    assert "; did you mean max_num_batched_tokens? (known: " in done.stderr
    assert "max_num_batched_tokens" not in profile.space.names


def test_a_knob_both_untuned_and_under_knobs_says_what_to_do(tmp_path: Path) -> None:
    """The twin's drafter_adapter_rank put under untuned: too: the line said `untuned:
    'drafter_adapter_rank' is also defined under knobs:`, and stopped there. Now it says which
    list means what and to take it out of one of them, on one line."""
    twin = Path(__file__).parents[1] / "orchestrator" / "profiles" / "twin.yaml"
    data = yaml.safe_load(twin.read_text())
    data["untuned"] = ["drafter_adapter_rank"]
    (tmp_path / "both.yaml").write_text(yaml.safe_dump(data))
    done = orchestrate(tmp_path, "status", "--profile", str(tmp_path / "both.yaml"))
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip() == (
        f"Error: profile {tmp_path / 'both.yaml'}: knob 'drafter_adapter_rank' is both under "
        "untuned: (left to the launcher, never tuned) and under knobs: (tuned): take it out of "
        "untuned: to tune it, or out of knobs: to leave it to the launcher"
    ), done.stderr


def test_every_node_works_in_the_workdir_asked_for(tmp_path: Path) -> None:
    """`--workdir` is every node's directory (launchers, logs, pid files, the claim); without
    it, /var/lib/orchestrate/NAME. One a remote shell could not take as one word is refused in
    one line, and nothing is written."""
    profile, _ = _init(tmp_path, "card002-v5-tp4.sh", "--nodes", "a,b,c,d", "--workdir", "/srv/glm")
    assert {n.workdir for n in profile.cluster.nodes} == {"/srv/glm"}
    default, _ = _init(tmp_path, "vllm-cpu-ngram.sh", "--force")
    assert [n.workdir for n in default.cluster.nodes] == ["/var/lib/orchestrate/vllm-cpu-ngram"]
    out = tmp_path / "bad.yaml"
    done = orchestrate(
        tmp_path,
        "init",
        "--from",
        str(LAUNCHERS / "vllm-cpu-ngram.sh"),
        "--out",
        str(out),
        "--workdir",
        "/srv/a b;rm -rf /",
    )
    assert done.returncode == 3, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "workdir" in done.stderr
    assert not out.exists()


def test_fp8_as_vllm_reads_it_is_the_catalogs_fp8_e4m3_and_an_untuned_flag_says_why(
    tmp_path: Path,
) -> None:
    """vLLM reads ``--kv-cache-dtype fp8`` as ``fp8_e4m3``: the knob is tuned from that value
    (it was left untuned, ``fp8`` being none of the catalog's spellings), said in init's
    output; a flag left untuned (8000 is no step of MNBT's domain) says why there too, not only
    in the file's header."""
    launcher = tmp_path / "serve.sh"
    launcher.write_text(
        "vllm serve /models/m --kv-cache-dtype fp8 --max-num-batched-tokens 8000 \\\n"
        "  --speculative-config "
        '\'{"method":"dflash","model":"/models/d","num_speculative_tokens":5}\'\n'
    )
    done = orchestrate(tmp_path, "init", "--from", str(launcher), timeout=60)
    assert done.returncode == 0, done.stderr
    profile = load_profile(str(tmp_path / "serve.yaml"))
    assert profile.initial_champion()["kv_cache_dtype"] == "fp8_e4m3"
    assert "kv_cache_dtype" not in profile.untuned
    assert "--kv-cache-dtype" not in profile.launcher.argv
    said = done.stdout.splitlines()
    assert (
        "  note: kv_cache_dtype: vLLM reads --kv-cache-dtype fp8 as fp8_e4m3: adopted as that, "
        "rendered --kv-cache-dtype fp8_e4m3 from now on"
    ) in said, said
    assert (
        "  untuned: max_num_batched_tokens: --max-num-batched-tokens 8000 is not an integer from "
        "2048 to 16384 in steps of 512"
    ) in said, said
    head = _commands(tmp_path, str(tmp_path / "serve.yaml"))["node-0"]
    assert head[head.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert head[head.index("--max-num-batched-tokens") + 1] == "8000"


def test_untuned_lines_name_only_what_the_launcher_sets(tmp_path: Path) -> None:
    """Init's ``untuned:`` lines listed every catalog knob the launcher does not set too (``the
    command has no --kv-cache-dtype``), as if something were wrong with it. They now list only
    a knob the launcher sets to something the catalog cannot tune from, saying where the value
    is; the knobs it does not set stay out of the profile's tuning (``untuned:``), said once in
    the file's header."""
    profile, said = _init(tmp_path, "card000-x86.sh")
    assert set(profile.untuned) == {
        "max_num_batched_tokens",
        "drafter_adapter_rank",
        "kv_cache_dtype",
        "gpu_memory_utilization",
    }
    lines = said.splitlines()
    assert lines[0].endswith(
        "2 knob(s) recognised (num_speculative_tokens=7, cuda_graphs=true), 1 left untuned, "
        "1 node(s)"
    ), lines
    untuned = [line for line in lines if line.startswith("  untuned:")]
    assert untuned == [
        "  untuned: drafter_adapter_rank: --speculative-config's model "
        "/models/GLM-5.3-Flash-DFlash2-F is none of what the catalog renders for 0, 16, 32, "
        "64, 128"
    ], lines
    header = (tmp_path / "card000-x86.yaml").read_text().split("\n\n")[0]
    assert (
        "# Not set by the launcher, so not tuned: max_num_batched_tokens, kv_cache_dtype, "
        "gpu_memory_utilization (each stays the engine's default)." in header
    ), header
    assert "the command has no" not in said + header
