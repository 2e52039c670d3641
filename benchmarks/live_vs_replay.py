"""Does the replay order the policies as the live server does? The live benchmark's workloads, replayed.

    .venv/bin/python benchmarks/live_vs_replay.py        # about a minute

Each live page (docs/results/live-bench*.json, written by benchmarks/live_bench.py: `agentcache bench` against
the real SGLang server on CPU) is set beside the replays of exactly the workload it sent
(`agentcache.bench.as_served`: the generated trace at the bench's seed, segments scaled, outputs capped,
the same KV capacity and pacing): the untimed replay (SGLang's radix cache, requests served at once)
and the timed one (agentcache/replay/serving.py: a queue, batches and step times from the cost model of
an 8B model on one H100). The live figures are medians over the page's repetitions. Seconds differ by
design (a CPU server running a small model against a modelled GPU): what is compared is each one's
order of the policies, by hit rate and by time to first token. Writes docs/results/live-vs-replay.md.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from pages import load, save, template
from suite import mean_prompt

from agentcache.bench.report import median_range
from agentcache.bench.runner import CAPACITY_FACTOR
from agentcache.bench.workload import (
    BENCH_FAMILY,
    BENCH_SEED,
    BENCH_WORKFLOWS,
    MAX_NEW_TOKENS,
    TIME_SCALE,
    TOKEN_SCALE,
    as_served,
)
from agentcache.replay.runner import PreparedTrace, replay
from agentcache.replay.serving import serve_trace
from agentcache.workloads import GenConfig, generate


@dataclass(frozen=True)
class LivePage:
    """A live page and the `agentcache bench` arguments it ran with (its Command line)."""

    name: str
    family: str = BENCH_FAMILY
    workflows: int = BENCH_WORKFLOWS
    token_scale: float = TOKEN_SCALE
    capacity: int | None = None  # None: CAPACITY_FACTOR mean prompts, as the bench sizes it


PAGES = (
    LivePage("live-bench"),
    LivePage("live-bench-full-prompts", token_scale=1.0),
    LivePage("live-bench-phased-chat", family="phased-chat", workflows=12),
    LivePage("live-bench-chat", family="chat", capacity=3675),
)


def order(figures: dict[str, float], reverse: bool) -> list[str]:
    return sorted(figures, key=lambda p: figures[p], reverse=reverse)


def live_ordered_pairs(repetitions: dict[str, list[float]]) -> list[tuple[str, str]]:
    """The pairs (lower, higher) whose live repetitions do not overlap: the pairs the live runs order."""
    pairs = []
    policies = list(repetitions)
    for i, p in enumerate(policies):
        for q in policies[i + 1 :]:
            if max(repetitions[p]) < min(repetitions[q]):
                pairs.append((p, q))
            elif max(repetitions[q]) < min(repetitions[p]):
                pairs.append((q, p))
    return pairs


def agreeing(pairs: list[tuple[str, str]], replayed: dict[str, float]) -> int:
    """Of the live-ordered pairs, those the replay puts in the same order (strictly)."""
    return sum(replayed[low] < replayed[high] for low, high in pairs)


def compare(page: LivePage) -> dict:
    live = load(page.name)["policies"]
    policies = list(live)
    trace = as_served(
        generate(page.family, GenConfig(workflows=page.workflows, seed=BENCH_SEED)), page.token_scale, MAX_NEW_TOKENS
    )
    capacity = page.capacity or int(CAPACITY_FACTOR * mean_prompt(trace))
    prepared = PreparedTrace(trace)
    untimed = {r.policy: r.hit_rate for r in replay(trace, policies, [capacity])}
    timed = {p: serve_trace(prepared, p, capacity, time_scale=TIME_SCALE).summary() for p in policies}
    return {
        "page": page.name,
        "requests": len(trace.requests),
        "capacity": capacity,
        "live_hit": {p: [r["hit_rate"] for r in live[p]["repetitions"]] for p in policies},
        "live_ttft": {p: [r["ttft_s"] for r in live[p]["repetitions"]] for p in policies},
        "untimed_hit": untimed,
        "timed_hit": {p: timed[p]["hit_rate"] for p in policies},
        "timed_ttft": {p: timed[p]["ttft_p50_s"] for p in policies},
    }


def markdown(rows: list[dict], command: str) -> str:
    sections = []
    gaps = {
        row["page"]: [100 * (row["timed_hit"][p] - statistics.median(v)) for p, v in row["live_hit"].items()]
        for row in rows
    }
    counts = {"hit": [0, 0], "ttft": [0, 0]}  # agreeing, live-ordered
    for row in rows:
        policies = list(row["live_hit"])
        hit_pairs, ttft_pairs = live_ordered_pairs(row["live_hit"]), live_ordered_pairs(row["live_ttft"])
        # Hit rate: higher is better, so a pair (lower, higher) agrees where the replay's is also higher.
        hit_untimed, hit_timed = agreeing(hit_pairs, row["untimed_hit"]), agreeing(hit_pairs, row["timed_hit"])
        ttft = agreeing(ttft_pairs, row["timed_ttft"])
        counts["hit"][0] += hit_timed
        counts["hit"][1] += len(hit_pairs)
        counts["ttft"][0] += ttft
        counts["ttft"][1] += len(ttft_pairs)
        median_hit = {p: statistics.median(v) for p, v in row["live_hit"].items()}
        median_ttft = {p: statistics.median(v) for p, v in row["live_ttft"].items()}
        sections += [
            f"## {row['page']} ({row['requests']} requests, {row['capacity']:,} tokens)",
            "",
            "| policy | live hit rate | untimed replay | timed replay | live TTFT (s) | timed replay TTFT (s) |",
            "|---|---:|---:|---:|---:|---:|",
            *(
                f"| {p} | {median_range(row['live_hit'][p], '.1%')} | {row['untimed_hit'][p]:.1%} | {row['timed_hit'][p]:.1%} "
                f"| {median_range(row['live_ttft'][p], '.3f')} | {row['timed_ttft'][p]:.4f} |"
                for p in policies
            ),
            "",
            f"Live order by hit rate (medians): {', '.join(order(median_hit, True))}; pairs the live repetitions"
            f" order: {len(hit_pairs)} of {len(policies) * (len(policies) - 1) // 2}, in the same order in the"
            f" untimed replay {hit_untimed}, in the timed one {hit_timed}. By time to first token: live"
            f" {', '.join(order(median_ttft, False))}, timed replay {', '.join(order(row['timed_ttft'], False))};"
            f" pairs the live repetitions order: {len(ttft_pairs)}, in the same order in the timed replay {ttft}.",
            "",
        ]
    return "\n".join(
        [
            "# The replay beside the live server",
            "",
            *template("live-vs-replay/intro.md", command=command),
            "",
            f"**Of the pairs of policies the live repetitions order, the timed replay orders {counts['hit'][0]} of"
            f" {counts['hit'][1]} the same way by hit rate and {counts['ttft'][0]} of {counts['ttft'][1]} by time to"
            " first token.**",
            "",
            "The timed replay's hit rate less the live median, per page: "
            + "; ".join(
                f"{row['page']} {min(gaps[row['page']]):+.1f} to {max(gaps[row['page']]):+.1f} points" for row in rows
            )
            + ". On the CPU server a hit saves part of a prompt token's time ([prefill-cost.md](archive/prefill-cost.md)),",
            "so its TTFT differences are smaller than the modelled GPU's.",
            "",
            *sections,
        ]
    )


def page_of(saved: dict) -> str:
    """The page (but its Made by line), from what a run wrote (`pages.save`)."""
    return markdown(saved["rows"], saved["command"])


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    save("live-vs-replay", page_of, {"rows": [compare(page) for page in PAGES]})


if __name__ == "__main__":
    main()
