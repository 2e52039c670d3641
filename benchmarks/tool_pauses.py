"""Issue 52's replay clause: what pbkv keeps of agents waiting on tools, through SGLang's radix cache, written into
docs/results/tool-pauses.md and docs/results/tool-pauses.json.

    .venv/bin/python benchmarks/tool_pauses.py               # a few minutes on 2 cores
    .venv/bin/python benchmarks/tool_pauses.py --pages-only  # the page again from its JSON

The generated tool family as the suite makes it (150 workflows, seed 1) and its held-out variant (other agents,
tools and durations; seed 11, never used while building the policy), each at 4x, 8x and 16x its mean prompt:
`agentcache gen`, then `agentcache replay --json` with lru, lfu, session-lru, session-lfu, pbkv without tool
events (`pbkv/-tools`), pbkv and the offline reference, and again pbkv with the trace's tool events left out
(`--ignore-events tool`). The verdict per point: pbkv at or above each of the others, above them where the cache
is contended (lru and the offline reference 2 points apart or more). With a host tier (HiCache, twice the device
capacity): lru, pbkv, and pbkv's conservative prefetch with and without tool events (`pbkv+prefetch`,
`pbkv/-tools+prefetch`), the tokens a prefetch loaded and how many a request then read, and the cost model's GPU
time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from pages import ROOT, progress, render_again, save

NAME = "tool-pauses"
FAMILY, WORKFLOWS = "tool-use", 150  # the suite's generated trace (benchmarks/suite.py)
VARIANTS = (("default", 1, False), ("held-out", 11, True))  # name, seed, --held-out
CAPACITY_FACTORS = (4, 8, 16)  # x the trace's mean prompt, as the suite's
OURS, WITHOUT, IGNORED, REFERENCE = "pbkv", "pbkv/-tools", "pbkv, events ignored", "belady"
OTHERS = ("lru", "lfu", "session-lru", "session-lfu")
POLICIES = ",".join((*OTHERS, WITHOUT, OURS, REFERENCE))
HOST_POLICIES = ("lru", OURS, "pbkv/-tools+prefetch", "pbkv+prefetch")
HOST_FACTOR = 2  # host tier: this many times the device capacity
CONTENDED = 0.02  # lru and the offline reference this far apart: the cache is contended
AGENTCACHE = str(ROOT / ".venv/bin/agentcache")


def run_json(command: list[str]) -> list[dict]:
    """Run an agentcache command (its progress on stderr, shown) and read the JSON line it ends with."""
    proc = subprocess.run(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout)
        sys.exit(proc.returncode)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def shown(command: list[str], path: str) -> str:
    """The command as a user types it, the temporary trace by its file name alone."""
    return " ".join(os.path.basename(w) if w == path else w for w in ["agentcache", *command[1:]])


def measure() -> dict:
    from agentcache.trace import read_trace

    variants = []
    with (
        progress("tool pauses: replays", (2 + len(CAPACITY_FACTORS)) * len(VARIANTS)) as bar,
        tempfile.TemporaryDirectory() as folder,
    ):
        for name, seed, held_out in VARIANTS:
            path = os.path.join(folder, f"tool-use-{name}.jsonl")
            gen = [AGENTCACHE, "gen", FAMILY, "-o", path, "--workflows", str(WORKFLOWS), "--seed", str(seed)]
            gen += ["--held-out"] if held_out else []
            subprocess.run(gen, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
            requests = read_trace(path).requests
            mean_prompt = sum(r.prompt_tokens for r in requests) / len(requests)
            capacities = ",".join(str(int(mean_prompt * f)) for f in CAPACITY_FACTORS)
            bar.describe(f"tool pauses: {name}, every policy")
            replay = [AGENTCACHE, "replay", path, "--capacity", capacities, "--policy", POLICIES, "--json"]
            runs = run_json(replay)
            bar.advance()
            bar.describe(f"tool pauses: {name}, pbkv with the events ignored")
            ignored = [AGENTCACHE, "replay", path, "--capacity", capacities, "--policy", OURS]
            ignored += ["--ignore-events", "tool", "--json"]
            runs += [{**run, "policy": IGNORED} for run in run_json(ignored)]
            bar.advance()
            host, host_commands = [], []
            for capacity in capacities.split(","):
                bar.describe(f"tool pauses: {name}, host tier at {int(capacity):,}")
                tiered = [AGENTCACHE, "replay", path, "--capacity", capacity, "--policy", ",".join(HOST_POLICIES)]
                tiered += ["--host-capacity", str(HOST_FACTOR * int(capacity)), "--json"]
                host += [host_row(run) for run in run_json(tiered)]
                host_commands.append(shown(tiered, path))
                bar.advance()
            points = []
            for capacity in dict.fromkeys(run["capacity"] for run in runs):
                hit = {run["policy"]: run["hit_rate"] for run in runs if run["capacity"] == capacity}
                points.append({"capacity": capacity, "hit_rate": hit})
            variants.append(
                {
                    "variant": name,
                    "seed": seed,
                    "requests": len(requests),
                    "mean_prompt": round(mean_prompt),
                    "commands": [shown(gen, path), shown(replay, path), shown(ignored, path)],
                    "points": points,
                    "host_commands": host_commands,
                    "host": host,
                }
            )
    return {"variants": variants}


def host_row(run: dict) -> dict:
    keys = ("policy", "capacity", "hit_rate", "host_hit_tokens", "prompt_tokens", "prefetched_tokens")
    return {k: run[k] for k in keys} | {
        "prefetch_used": run["prefetch_used_tokens"],
        "gpu_s": run["modelled_latency_s"],
    }


def verdict(hit: dict[str, float]) -> tuple[bool, bool, bool]:
    """(contended, pbkv at or above every other, pbkv above every other) at one point."""
    ours = hit[OURS]
    others = [hit[p] for p in (*OTHERS, WITHOUT, IGNORED)]
    return hit["lru"] <= hit[REFERENCE] - CONTENDED, all(ours >= h for h in others), all(ours > h for h in others)


def markdown(saved: dict) -> str:
    columns = (*OTHERS, WITHOUT, IGNORED, OURS, REFERENCE)
    lines = [
        "# Tool pauses: what pbkv keeps of agents waiting on tools",
        "",
        "The replay part of issue 52 (the timed replay and the live bench: [tool-pauses-live.md](tool-pauses-live.md)).",
        f"The generated tool family ({WORKFLOWS} workflows; the held-out variant has other agents, tools and",
        "durations, at a seed never used while building the policy) replayed through SGLang's radix cache at",
        "4x, 8x and 16x its mean prompt. `pbkv/-tools`: pbkv hearing no tool event; `pbkv, events ignored`: pbkv",
        "on the trace with its tool events left out (`--ignore-events tool`), which `pbkv/-tools` equals to the",
        "token. `contended`: lru and the offline reference 2 points apart or more, where pbkv must be above every",
        "other policy; elsewhere at or above. Hit rates, higher is better.",
    ]
    for variant in saved["variants"]:
        lines += ["", f"## {variant['variant']} (seed {variant['seed']})", ""]
        lines += [
            f"{variant['requests']:,} requests, mean prompt {variant['mean_prompt']:,} tokens. Made by:",
            "",
            *(f"    {command}" for command in variant["commands"]),
            "",
            "| capacity | " + " | ".join(columns) + " | contended | pbkv >= every other | pbkv > every other |",
            "|---:|" + "---:|" * len(columns) + "---|---|---|",
        ]
        for point in variant["points"]:
            hit = point["hit_rate"]
            contended, at_or_above, above = verdict(hit)
            cells = " | ".join(f"{hit[p]:.1%}" for p in columns)
            yes = ("yes", "no")
            lines.append(
                f"| {point['capacity']:,} | {cells} | {yes[not contended]} | {yes[not at_or_above]} "
                f"| {yes[not above]} |"
            )
        lines += [
            "",
            f"With a host tier of {HOST_FACTOR}x the device capacity: device hit rate, host hit rate (reloaded at",
            "request time), tokens a prefetch loaded / of them read by a request, and the cost model's GPU time",
            "(s, lower is better). Made by:",
            "",
            *(f"    {command}" for command in variant["host_commands"]),
            "",
            "| capacity | policy | device hits | host hits | prefetched / read | GPU time (s) |",
            "|---:|---|---:|---:|---:|---:|",
        ]
        for run in variant["host"]:
            lines.append(
                f"| {run['capacity']:,} | {run['policy']} | {run['hit_rate']:.1%} "
                f"| {run['host_hit_tokens'] / run['prompt_tokens']:.1%} "
                f"| {run['prefetched_tokens']:,} / {run['prefetch_used']:,} | {run['gpu_s']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages-only", action="store_true", help="write the page again from its JSON")
    args = parser.parse_args()
    if args.pages_only:
        render_again(NAME, markdown)
        return
    save(NAME, markdown, measure())


if __name__ == "__main__":
    main()
