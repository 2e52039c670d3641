"""Issue 52's timings: the calls that follow a tool, in the timed replay and live, written into
docs/results/tool-pauses-live.md and docs/results/tool-pauses-live.json.

    .venv/bin/python benchmarks/tool_pauses_live.py                 # both parts
    .venv/bin/python benchmarks/tool_pauses_live.py --part replay   # the timed replay alone (minutes)
    .venv/bin/python benchmarks/tool_pauses_live.py --part bench    # the live bench alone (15 CPU servers)
    .venv/bin/python benchmarks/tool_pauses_live.py --pages-only    # the page again from its JSON

The timed replay: the generated tool family (the suite's: 150 workflows, seed 1) through one modelled SGLang
worker per policy at 4x, 8x and 16x its mean prompt (`agentcache gen` then `agentcache replay --timed --json`).
The live bench: `agentcache bench --family tool-use` with the same policies, 3 repetitions, each on a fresh
server; the trace's tool events go to the plugin's events route at their scaled times (plain SGLang, lfu and
session-lfu's server, has no such route). Figures per policy: the time to first token of the calls that follow
a tool (p50, p90), all calls' and each workflow's completion time; live, the prompt tokens computed in each
repetition too (what the machine's load does not move). A part run alone keeps the other's figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from pages import RESULTS, ROOT, load, provenance, render_again, save

NAME = "tool-pauses-live"
POLICIES = "lru,lfu,session-lfu,pbkv/-tools,pbkv"
OURS, WITHOUT = "pbkv", "pbkv/-tools"
FAMILY, WORKFLOWS, SEED = "tool-use", 150, 1  # the suite's generated trace (benchmarks/suite.py)
CAPACITY_FACTORS = (4, 8, 16)  # x the trace's mean prompt, as the suite's
# Live: the bench's generated workload (16 workflows, seed 7) at this scale of the trace's times: a tool's median
# pause (2.6 s in the trace) is 0.5 s, about one CPU prefill of another workflow's call, its p90 (33 s) 6.6 s.
BENCH_TIME_SCALE = 0.2
# KV tokens: 5x the served workload's mean prompt (1,267 tokens), where the cache is contended (replayed, lru 58.3%
# against the offline reference's 67.7%); at the bench's default 10x every policy reaches the unlimited ceiling.
BENCH_CAPACITY = 6_300
BENCH_REPEAT = 3
AGENTCACHE = str(ROOT / ".venv/bin/agentcache")


def run_json(command: list[str]) -> object:
    """Run an agentcache command (its progress on stderr, shown) and read the JSON line it ends with."""
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        sys.exit(proc.returncode)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shown(command: list[str], path: str = "") -> str:
    """The command as a user types it, a temporary trace file by its name alone."""
    words = ["agentcache", *command[1:]]
    return " ".join(os.path.basename(w) if path and w == path else w for w in words)


def timed_replay() -> dict:
    from agentcache.trace import read_trace

    made = provenance()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "tool-use.jsonl")
        gen = [AGENTCACHE, "gen", FAMILY, "-o", path, "--workflows", str(WORKFLOWS), "--seed", str(SEED)]
        subprocess.run(gen, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
        requests = read_trace(path).requests
        mean_prompt = sum(r.prompt_tokens for r in requests) / len(requests)
        capacities = ",".join(str(int(mean_prompt * f)) for f in CAPACITY_FACTORS)
        replay = [AGENTCACHE, "replay", path, "--timed", "--capacity", capacities, "--policy", POLICIES, "--json"]
        runs = run_json(replay)
    keep = ("capacity", "policy", "requests", "hit_rate", "ttft_p50_s", "ttft_p90_s", "post_tool_requests")
    keep += ("post_tool_ttft_p50_s", "post_tool_ttft_p90_s", "workflow_completion_p50_s", "workflow_completion_p90_s")
    return {
        **made,
        "commands": [shown(gen, path), shown(replay, path)],
        "runs": [{k: run[k] for k in keep} for run in runs],
    }


def live_bench() -> dict:
    bench = [AGENTCACHE, "bench", "--family", FAMILY, "--policy", POLICIES, "--repeat", str(BENCH_REPEAT)]
    bench += ["--time-scale", str(BENCH_TIME_SCALE), "--capacity", str(BENCH_CAPACITY), "--json"]
    made, load_before = provenance(), os.getloadavg()[0]
    summary = run_json(bench)
    return {
        **made,
        "commands": [shown(bench)],
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],  # 1-minute, before and after
        "policies": summary,
    }


# ---------------------------------------------------------------- the page


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cell(spread: dict | None) -> str:
    return "-" if spread is None else f"{spread['median']:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"


def replay_section(part: dict) -> list[str]:
    runs = part["runs"]
    lines = [
        "## Timed replay (modelled seconds: an 8B model on one H100)",
        "",
        f"Made by `{part['commands'][1]}` (the trace: `{part['commands'][0]}`) at commit `{part['commit']}`.",
        "",
        "| capacity | policy | hit rate | TTFT p50 (s) | TTFT p90 (s) | after-tool TTFT p50 (s) "
        "| after-tool TTFT p90 (s) | workflow p50 (s) | workflow p90 (s) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in runs:
        lines.append(
            f"| {r['capacity']:,} | {r['policy']} | {r['hit_rate']:.1%} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f}"
            f" | {seconds(r['post_tool_ttft_p50_s'])} | {seconds(r['post_tool_ttft_p90_s'])}"
            f" | {r['workflow_completion_p50_s']:.1f} | {r['workflow_completion_p90_s']:.1f} |"
        )
    lines += ["", *replay_verdicts(runs)]
    return lines


def replay_verdicts(runs: list[dict]) -> list[str]:
    """Issue 52's third clause, per capacity: pbkv's p90 after-tool TTFT below pbkv's without tool events and
    below every other policy's."""
    lines = []
    for capacity in dict.fromkeys(r["capacity"] for r in runs):
        p90 = {r["policy"]: r["post_tool_ttft_p90_s"] for r in runs if r["capacity"] == capacity}
        if OURS not in p90 or p90[OURS] is None:
            continue
        others = {p: v for p, v in p90.items() if p != OURS and v is not None}
        below = [p for p, v in others.items() if p90[OURS] < v]
        not_below = [f"{p} ({v:.3f} s)" for p, v in others.items() if p90[OURS] >= v]
        verdict = "below every other policy's" if not not_below else f"not below {', '.join(not_below)}"
        lines.append(
            f"- {capacity:,} tokens: pbkv's p90 after-tool TTFT {p90[OURS]:.3f} s, {verdict}"
            + (f" (below {len(below)} of {len(others)})" if not_below else "")
            + "."
        )
    return lines


def bench_section(part: dict) -> list[str]:
    summary = part["policies"]
    before, after = part["load_average"]
    lines = [
        "## Live bench (CPU server, small random-weight model)",
        "",
        f"Made by `{part['commands'][0]}` at commit `{part['commit']}`.",
        "",
        f"Timings are noisy: the machine (2 cores) was shared with other work (1-minute load average {before:g}"
        f" at the start, {after:g} at the end). The prompt tokens each run computed come from the server's own"
        " usage report and do not depend on the load; they are given per repetition.",
        "",
        "| policy | hit rate | prompt tokens computed, per repetition | TTFT (s) | after-tool TTFT p50 (s) "
        "| after-tool TTFT p90 (s) | workflow p50 (s) | workflow p90 (s) | completion (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for policy, r in summary.items():
        per_rep = ", ".join(f"{rep['computed_prompt_tokens']:,}" for rep in r["repetitions"])
        lines.append(
            f"| {policy} | {r['hit_rate']:.1%} | {per_rep} | {cell(r['ttft_s'])} | {cell(r['post_tool_ttft_p50_s'])}"
            f" | {cell(r['post_tool_ttft_p90_s'])} | {cell(r['workflow_completion_p50_s'])}"
            f" | {cell(r['workflow_completion_p90_s'])} | {cell(r['makespan_s'])} |"
        )
    lines += ["", *bench_verdicts(summary)]
    return lines


def bench_verdicts(summary: dict) -> list[str]:
    """Issue 52's fourth clause: pbkv computes fewer prompt tokens than every other policy in every repetition."""
    if OURS not in summary:
        return []
    mine = {rep["repetition"]: rep["computed_prompt_tokens"] for rep in summary[OURS]["repetitions"]}
    lines = []
    for policy, r in summary.items():
        if policy == OURS:
            continue
        theirs = {rep["repetition"]: rep["computed_prompt_tokens"] for rep in r["repetitions"]}
        ratios = [mine[i] / theirs[i] for i in sorted(mine) if theirs.get(i)]
        fewer = sum(x < 1.0 for x in ratios)
        lines.append(
            f"- pbkv vs {policy}: fewer prompt tokens computed in {fewer} of {len(ratios)} repetitions"
            f" ({', '.join(f'{x:.2f}x' for x in ratios)})."
        )
    return lines


def markdown(saved: dict) -> str:
    lines = [
        "# Tool pauses: the calls that follow a tool, timed",
        "",
        "Issue 52's measurements. A call that follows a tool (the agent's first call after its tool ended) re-sends"
        " its previous prompt and answer: it is the call that pays when the pause let other workflows evict them."
        " Policies: SGLang's lru, lfu and session cache over lfu (`session-lfu`, each workflow a session), pbkv"
        " without the tool events (`pbkv/-tools`) and pbkv with them. Workflow completion: each workflow's first"
        " request to its last answer (p50, p90 over workflows). p50 and p90 are the values at rank floor(q n).",
    ]
    if "replay" in saved:
        lines += ["", *replay_section(saved["replay"])]
    if "bench" in saved:
        lines += ["", *bench_section(saved["bench"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=("replay", "bench", "all"), default="all")
    parser.add_argument("--pages-only", action="store_true", help="write the page again from its JSON")
    args = parser.parse_args()
    if args.pages_only:
        render_again(NAME, markdown)
        return
    figures = {}
    if (RESULTS / f"{NAME}.json").exists():  # a part run alone keeps the other's figures
        figures = {k: v for k, v in load(NAME).items() if k in ("replay", "bench")}
    if args.part in ("replay", "all"):
        figures["replay"] = timed_replay()
    if args.part in ("bench", "all"):
        figures["bench"] = live_bench()
    save(NAME, markdown, figures)


if __name__ == "__main__":
    main()
