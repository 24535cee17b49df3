"""``python -m cluster.twin`` (and ``orchestrate twin …``): serve, clocks, power-cycle, optimum.

- ``serve MODEL [vllm serve flags]``: one node of the twin (see ``cluster.twin.serve``).
- ``clocks``: the node's SM clock and matmul rate as one JSON line (what a preflight runs).
- ``power-cycle``: clear the node's stuck clocks.
- ``optimum [--landscape PATH_OR_NAME]``: the landscape's ground truth as JSON.
The node directory is ``TWIN_NODE_DIR``; the landscape ``TWIN_LANDSCAPE`` (for ``serve``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

# only what a node's queries need: a preflight runs ``clocks`` on every node around every bench
# cell, and an interpreter that imported the landscape (pydantic, the knob catalog) took 0.4 s
# of it each time where the query itself takes milliseconds; ``serve`` and ``optimum`` import
# theirs when called
from cluster.twin import node
from orchestrator.errors import OrchestrateError

USAGE = """usage: python -m cluster.twin {serve,clocks,power-cycle,optimum} ...

  serve MODEL [vllm serve flags]   run one node of the twin (env: TWIN_LANDSCAPE, TWIN_NODE_DIR,
                                   TWIN_SEED, TWIN_NOISE, TWIN_BOOT_SCALE, TWIN_RUN_SCALE)
  clocks                           print this node's {"sm_clock_mhz", "matmul_rate"} as JSON
  power-cycle                      clear this node's stuck clocks (TWIN_NODE_DIR)
  optimum [--landscape PATH|NAME]  print the landscape's ground truth as JSON
"""


def _clocks(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="python -m cluster.twin clocks").parse_args(argv)
    state = node.load(node.node_dir(os.environ.get(node.ENV_NODE_DIR)))
    print(json.dumps(node.matmul_check(state.matmul_rate)), flush=True)
    return 0


def _power_cycle(argv: list[str]) -> int:
    argparse.ArgumentParser(prog="python -m cluster.twin power-cycle").parse_args(argv)
    directory = node.node_dir(os.environ.get(node.ENV_NODE_DIR))
    state = node.load(directory)
    was = state.stuck
    state.stuck, state.stuck_rate, state.stuck_since_boot = False, 1.0, None
    state.power_cycles += 1
    node.save(directory, state)
    print(
        json.dumps({"power_cycled": True, "was_stuck": was, "power_cycles": state.power_cycles}),
        flush=True,
    )
    return 0


def _optimum(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m cluster.twin optimum",
        description="Print a landscape's ground truth as JSON.",
    )
    p.add_argument("--landscape", default=None, help="landscape YAML path or shipped name")
    ns = p.parse_args(argv)
    from cluster.twin.environment import ENV_LANDSCAPE
    from cluster.twin.landscape import DEFAULT_LANDSCAPE, load_landscape

    name = ns.landscape or os.environ.get(ENV_LANDSCAPE) or DEFAULT_LANDSCAPE
    print(json.dumps(load_landscape(name).optimum(), indent=2, sort_keys=False), flush=True)
    return 0


def _serve(argv: list[str]) -> int:
    from cluster.twin.serve import main_serve

    return main_serve(argv)


def main(argv: list[str]) -> int:
    """Run a twin subcommand; the exit status (2 usage, 3 bad landscape, 6 node state).

    Library errors become one ``Error: …`` line on stderr; argparse errors exit 2 with usage.
    """
    if not argv or argv[0] in ("-h", "--help"):
        stream = sys.stdout if argv else sys.stderr
        stream.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    handlers = {
        "serve": _serve,
        "clocks": _clocks,
        "power-cycle": _power_cycle,
        "optimum": _optimum,
    }
    handler = handlers.get(command)
    if handler is None:
        sys.stderr.write(USAGE + f"error: unknown command {command!r}\n")
        return 2
    try:
        return handler(rest)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    except OrchestrateError as e:
        print(f"Error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
