"""Instructions of the cache work per request, counted by valgrind's callgrind: figures this machine's noise
does not move.

    .venv/bin/python benchmarks/overhead_instructions.py     # 100 in flight, 200,000 tokens, lfu and pbkv: ~8 minutes
    .venv/bin/python benchmarks/overhead_instructions.py --in-flight 500 --capacity 50000 --policy lru,lfu,pbkv

Wall time on a shared 2-core machine moves by tens of percent within minutes (benchmarks/overhead.py pairs and
repeats its runs for that, and still reports spreads of +-10%). Instructions do not: each policy's replay
(benchmarks/overhead.py's workload and replay, the garbage collector's view frozen first) runs in a process of
its own under callgrind, counting from the replay's start to its end (instrumentation switched on and off
around it with callgrind_control), the garbage collections it triggers included. A change that saves
instructions shows here to the last digit: run it before and after. Instructions are not time: a cache miss or
a collection's walk over memory costs many cycles for few instructions, so the ratio here is the part of the
wall-time ratio that executing more code explains. Needs valgrind (`apt-get install valgrind`). Writes
docs/overhead-instructions.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

RESULT = "RESULT "  # the line a child process answers with
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")


def child(policy: str, in_flight: int, capacity: int) -> None:
    """One replay, counted by the callgrind this process runs under."""
    from overhead import frozen_garbage_collector, workload

    from agentcache import compiled
    from agentcache.replay.runner import PreparedTrace, replay_policy

    prepared = PreparedTrace(workload(in_flight))
    pid = str(os.getpid())
    collections = [0, 0, 0]  # by generation, during the replay

    def collected(phase: str, info: dict) -> None:
        if phase == "stop":
            collections[info["generation"]] += 1

    with frozen_garbage_collector():
        subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
        gc.callbacks.append(collected)
        result = replay_policy(prepared, policy, capacity)
        gc.callbacks.remove(collected)
        subprocess.run(["callgrind_control", "--instr=off", pid], check=True, capture_output=True)
    answer = {
        "requests": result.requests,
        "hit_rate": result.hit_rate,
        "core": compiled.active(),
        "collections": collections,
    }
    print(RESULT + json.dumps(answer), flush=True)


def count(policy: str, in_flight: int, capacity: int) -> dict:
    """Instructions of one replay of `policy`, and its requests and hit rate."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            f"--callgrind-out-file={tmp}/callgrind.out",
            sys.executable,
            __file__,
            "--child",
            policy,
            str(in_flight),
            str(capacity),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
    answers = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    collected = COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not answers or not collected:
        raise SystemExit(
            f"the replay of {policy} under callgrind failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return {**json.loads(answers[-1][len(RESULT) :]), "instructions": int(collected[-1])}


def write_docs(rows: dict[str, dict], in_flight: int, capacity: int, command: str) -> None:
    from suite import DOCS

    baseline = rows.get("lfu")
    lines = [
        "# The scheduler's hot path in instructions",
        "",
        f"Command: `{command}` (CPython {platform.python_version()}, valgrind's callgrind; policy core"
        f" {next(iter(rows.values()))['core']}).",
        "",
        f"Code-retry workflows, {in_flight} in flight, capacity {capacity:,} tokens: benchmarks/overhead.py's replay",
        "through SGLang 0.5.23's radix cache, each policy in a process of its own, its instructions counted from the",
        "replay's start to its end (the garbage collections it triggers included). These counts do not move with",
        "what else the machine runs; wall time does (docs/overhead.md). Instructions are not time: a cache miss or a",
        "collection's walk over memory costs many cycles for few instructions.",
        "",
        "`collections`: the garbage collector's young / middle / full collections during the replay (each walks the",
        "objects of its generations: few instructions per object, a cache miss for many).",
        "",
        "| policy | instructions per request | / lfu | collections | hit rate |",
        "|---|---:|---:|---:|---:|",
    ]
    for policy, row in rows.items():
        per_request = row["instructions"] / row["requests"]
        ratio = f"{row['instructions'] / baseline['instructions']:.3f}x" if baseline else "-"
        collections = " / ".join(map(str, row["collections"]))
        lines.append(f"| {policy} | {per_request:,.0f} | {ratio} | {collections} | {row['hit_rate']:.3f} |")
    (DOCS / "overhead-instructions.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--in-flight", type=int, default=100, help="workflows in flight (default 100)")
    parser.add_argument("--capacity", type=int, default=200_000, help="KV capacity in tokens (default 200000)")
    parser.add_argument("--policy", default="lfu,pbkv", help="comma-separated policies (default lfu,pbkv)")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    if args.in_flight < 1 or args.capacity < 2 or not policies:
        parser.error("--in-flight must be at least 1, --capacity at least 2, and --policy must name a policy")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    rows = {}
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()) as progress:
        for policy in policies:
            task = progress.add_task(f"{policy} under callgrind (a few minutes)", total=1)
            rows[policy] = count(policy, args.in_flight, args.capacity)
            progress.update(task, completed=1)
            progress.console.print(
                f"{policy}: {rows[policy]['instructions'] / rows[policy]['requests']:,.0f} instructions per request,"
                f" collections {rows[policy]['collections']}, hit rate {rows[policy]['hit_rate']:.3f}"
            )
    command = "python benchmarks/overhead_instructions.py" + "".join(
        f" {flag} {value}"
        for flag, value, default in (
            ("--in-flight", args.in_flight, 100),
            ("--capacity", args.capacity, 200_000),
            ("--policy", ",".join(policies), "lfu,pbkv"),
        )
        if value != default
    )
    write_docs(rows, args.in_flight, args.capacity, command)
    Console().print(f"wrote docs/overhead-instructions.md ({Path(__file__).name})")


if __name__ == "__main__":
    main()
