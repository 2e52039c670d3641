"""pbkv's cache work per request in this checkout against another revision's, each paired with lfu.

    .venv/bin/python benchmarks/overhead_ab.py HEAD~1        # 100 in flight, 50,000 and 200,000 tokens
    .venv/bin/python benchmarks/overhead_ab.py 78a9125 --in-flight 100 --capacity 200000 --rounds 4 --repeat 3

A change that saves a few percent saves less than this machine's speed drifts over minutes, so a figure for
it needs pairing: each process (one revision) replays lfu and pbkv back to back (benchmarks/overhead.py's
replay: code-retry through SGLang's radix cache, the garbage collector's view frozen first), `--repeat` times
in alternating order, and keeps pbkv / lfu per repetition, a ratio that moves with the machine; the two
revisions' processes alternate, `--rounds` each. The other revision is checked out in a temporary git
worktree and imported in place of this checkout (agentcache and its predictor package, its engine layer and
its overhead.py), through the same SGLang. Prints each revision's pbkv / lfu (median [min-max]), this one's
over the other's, and both sides' pbkv hit rates: a change that keeps pbkv's decisions leaves them equal.
This checkout means its working tree, uncommitted changes included.

Both sides run the policy core the same way (`--core`): compiled, as setup builds it (the default: the other
revision's core is compiled in its worktree, and this checkout's build must match its sources), or from
source (AGENTCACHE_PURE_PYTHON=1 on both sides; revisions older than the compiled core run from source only).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULT = "RESULT "  # the line a child process answers with


def import_from(root: str) -> None:
    """Make `root`'s agentcache the one imported (before anything else can import this checkout's)."""
    sys.path[:0] = [root, f"{root}/benchmarks"]
    import agentcache

    # The package maps agentcache.predictor to the top-level predictor/ folder (pyproject's package-dir): the
    # installed mapping points at this checkout, so `root`'s is loaded by hand.
    spec = importlib.util.spec_from_file_location(
        "agentcache.predictor", f"{root}/predictor/__init__.py", submodule_search_locations=[f"{root}/predictor"]
    )
    assert spec is not None and spec.loader is not None
    predictor = importlib.util.module_from_spec(spec)
    sys.modules["agentcache.predictor"] = agentcache.predictor = predictor
    spec.loader.exec_module(predictor)


def build_child(root: str) -> None:
    """Compile `root`'s policy core into its own tree (its build_compiled finds the sources through the
    packages import_from mapped)."""
    import_from(root)
    from agentcache.build_compiled import build

    built = build()
    if built.problem:
        raise SystemExit(f"the compiled core at {root} does not load: {built.problem}")


def child(root: str, in_flight: int, capacities: list[int], repeat: int) -> None:
    """Replay lfu and pbkv with `root`'s code."""
    import_from(root)
    # Only names older revisions' overhead.py has too, so the timing loop below is this file's own, not one
    # shared with overhead.py's grid (a helper added there would be missing in the revisions compared with).
    from overhead import PreparedTrace, frozen_garbage_collector, replay_policy, workload

    import agentcache
    import agentcache.policy.pbkv
    import agentcache.predictor.markov

    for module in (agentcache, agentcache.policy.pbkv, agentcache.predictor.markov):
        if not Path(str(module.__file__)).is_relative_to(root):
            raise SystemExit(f"imported {module.__name__} from {module.__file__}, not from {root}")
    prepared = PreparedTrace(workload(in_flight))
    out: dict[str, dict] = {}
    for capacity in capacities:
        ms: dict[str, list[float]] = {"lfu": [], "pbkv": []}
        hit_rate = 0.0
        order = ["lfu", "pbkv"]
        for _ in range(repeat):
            for policy in order:
                with frozen_garbage_collector():
                    result = replay_policy(prepared, policy, capacity)
                ms[policy].append(result.replay_wall_s / result.requests * 1e3)
                if policy == "pbkv":
                    hit_rate = result.hit_rate
            order.reverse()
        out[str(capacity)] = {"ratios": [p / b for b, p in zip(ms["lfu"], ms["pbkv"])], "hit_rate": hit_rate}
    try:
        from agentcache.compiled import active
    except ImportError:  # a revision older than the compiled core
        core = "pure Python"
    else:
        core = active()
    print(RESULT + json.dumps({"core": core, "capacities": out}), flush=True)


def side_env(core: str) -> dict[str, str]:
    from agentcache.compiled import PURE_ENV  # the parent's own: a child imports its revision's agentcache first

    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    return env if core == "compiled" else {**env, PURE_ENV: "1"}


def prepare_compiled(root: Path, revision: str) -> None:
    """This checkout's build must match its sources; the other revision's is built in its worktree."""
    if root == REPO:
        from agentcache.compiled import Build

        problem = Build.read().problem
        if problem:
            raise SystemExit(f"this checkout's compiled policy core cannot be used: {problem}; or run --core source")
        return
    if not (root / "agentcache" / "build_compiled.py").is_file():
        raise SystemExit(f"{revision} has no compiled policy core: compare from source (--core source)")
    done = subprocess.run([sys.executable, __file__, "--build", str(root)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"compiling {revision}'s policy core failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def run_side(root: Path, in_flight: int, capacities: list[int], repeat: int, core: str) -> dict[str, dict]:
    command = [sys.executable, __file__, "--child", str(root), str(in_flight), ",".join(map(str, capacities))]
    done = subprocess.run([*command, str(repeat)], capture_output=True, text=True, env=side_env(core))
    answers = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not answers:
        raise SystemExit(f"the replay with the code at {root} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    answer = json.loads(answers[-1][len(RESULT) :])
    if (core == "compiled") != answer["core"].startswith("compiled"):
        raise SystemExit(f"the code at {root} ran its policy core {answer['core']}, not {core}")
    return answer["capacities"]


def compare(revision: str, in_flight: int, capacities: list[int], rounds: int, repeat: int, core: str) -> None:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    ratios: dict[str, dict[str, list[float]]] = {"other": {}, "this": {}}
    hit_rates: dict[str, dict[str, float]] = {"other": {}, "this": {}}
    with tempfile.TemporaryDirectory() as scratch:
        other = Path(scratch) / "other"
        added = subprocess.run(
            ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(other), revision],
            capture_output=True,
            text=True,
        )
        if added.returncode != 0:
            raise SystemExit(f"cannot check out {revision!r}: {added.stderr.strip()}")
        try:
            roots = {"other": other, "this": REPO}
            if core == "compiled":
                with Console(stderr=True).status(f"compiling {revision}'s policy core in its worktree"):
                    for root in roots.values():
                        prepare_compiled(root, revision)
            with Progress(console=Console(stderr=True)) as progress:
                task = progress.add_task(f"{revision} vs this checkout", total=2 * rounds)
                for k in range(rounds):
                    for side in ("other", "this") if k % 2 == 0 else ("this", "other"):
                        for capacity, answer in run_side(roots[side], in_flight, capacities, repeat, core).items():
                            ratios[side].setdefault(capacity, []).extend(answer["ratios"])
                            hit_rates[side][capacity] = answer["hit_rate"]
                        progress.advance(task)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], capture_output=True)

    def spread(values: list[float]) -> str:
        return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"

    table = Table(
        title=f"pbkv / lfu per request, {in_flight} in flight, {rounds} x {repeat} paired repetitions, policy core {core}"
    )
    for column in ("capacity", f"{revision}", "this checkout", "this / other", "pbkv hit rate other / this"):
        table.add_column(column, justify="right")
    for capacity in map(str, capacities):
        theirs, ours = ratios["other"][capacity], ratios["this"][capacity]
        table.add_row(
            f"{int(capacity):,}",
            spread(theirs),
            spread(ours),
            f"{statistics.median(ours) / statistics.median(theirs):.3f}",
            f"{hit_rates['other'][capacity]:.4f} / {hit_rates['this'][capacity]:.4f}",
        )
    Console().print(table)


def main() -> None:
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        root, in_flight, capacities, repeat = sys.argv[2:]
        child(root, int(in_flight), [int(c) for c in capacities.split(",")], int(repeat))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--build":
        build_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("revision", help="the git revision to compare this checkout with (HEAD~1, a commit)")
    parser.add_argument("--in-flight", type=int, default=100, help="workflows in flight (default 100)")
    parser.add_argument(
        "--capacity", default="50000,200000", help="KV capacities in tokens, comma-separated (default 50000,200000)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="processes per revision, alternating (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="paired lfu/pbkv replays per process (default 3)")
    parser.add_argument(
        "--core",
        choices=("compiled", "source"),
        default="compiled",
        help="run both sides' policy core compiled (default, as setup builds it) or from source",
    )
    args = parser.parse_args()
    capacities = [int(c) for c in args.capacity.split(",")]
    if args.rounds < 1 or args.repeat < 1 or args.in_flight < 1 or min(capacities) < 1:
        parser.error("--rounds, --repeat, --in-flight and every capacity must be at least 1")
    compare(args.revision, args.in_flight, capacities, args.rounds, args.repeat, args.core)


if __name__ == "__main__":
    main()
