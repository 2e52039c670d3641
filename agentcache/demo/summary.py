"""The demo's runs in words: per policy medians with their spread, ours against each other policy, and one plain
line saying where ours is ahead and by how much, and where not."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from agentcache.bench.runner import runs_on_plain_sglang
from agentcache.bench.runs import Run, paired_ratios
from agentcache.policy import PolicySpec


def summarize(runs: Sequence[Run]) -> dict[str, dict[str, float | int]]:
    """Per policy, medians over its repetitions (the keys of `agentcache demo --json`)."""
    out: dict[str, dict[str, float | int]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = [r for r in runs if r.policy == policy]
        out[policy] = {
            "hit_rate": statistics.median(r.hit_rate for r in mine),
            "mean_latency_s": statistics.median(r.mean_latency_s for r in mine),
            "p90_latency_s": statistics.median(r.p90_latency_s for r in mine),
            "requests": statistics.median(len(r.sent) for r in mine),
            "runs": len(mine),
        }
    return out


def ours_and_others(runs: Sequence[Run]) -> tuple[list[str], list[str]]:
    """The policies run with agentcache, and those run on plain SGLang, in the order they ran."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    plain = [p for p in policies if runs_on_plain_sglang(PolicySpec.parse(p))]
    return [p for p in policies if p not in plain], plain


def ratio_lines(runs: Sequence[Run]) -> list[str]:
    """Each of ours against each policy on plain SGLang: medians of per-repetition ratios, with their range."""
    ours, others = ours_and_others(runs)
    return [_ratio_line(runs, policy, other) for policy in ours for other in others]


def _ratio_line(runs: Sequence[Run], policy: str, other: str) -> str:
    hit = paired_ratios(runs, policy, other, "hit_rate")
    speed = [1.0 / x for x in paired_ratios(runs, policy, other, "mean_latency_s")]
    ahead = sum(x > 1.0 for x in hit)
    return (
        f"{policy} against {other}: {statistics.median(hit):.2f}x the hit rate [{min(hit):.2f}-{max(hit):.2f}], "
        f"higher in {ahead} of {len(hit)} repetitions; "
        f"{statistics.median(speed):.2f}x faster on mean latency [{min(speed):.2f}-{max(speed):.2f}] "
        f"(medians of {len(speed)} per-repetition ratios, [min-max])"
    )


def verdict(runs: Sequence[Run]) -> list[str]:
    """One plain line per policy of ours: whose hit rate it beat in every repetition and by how many points (the
    median of the per-repetition differences, [min to max]), whose not, and whose mean latency it beat (medians)."""
    ours, others = ours_and_others(runs)
    return [_verdict(runs, policy, others) for policy in ours if others]


def _verdict(runs: Sequence[Run], policy: str, others: Sequence[str]) -> str:
    ahead, behind = [], []
    for other in others:
        points = [d * 100 for d in _differences(runs, policy, other)]
        wins = sum(d > 0 for d in points)
        by = f"by {statistics.median(points):+.1f} points [{min(points):+.1f} to {max(points):+.1f}]"
        if wins == len(points):
            ahead.append(f"{other}'s ({by})")
        else:
            behind.append(f"{other}'s (higher in {wins} of {len(points)}, {by})")
    said = []
    if ahead:
        said.append(f"{policy}'s hit rate was above {_join(ahead)} in every repetition")
    if behind:
        said.append(
            f"{'it was' if ahead else policy + chr(39) + 's hit rate was'} not above {_join(behind)} in every one"
        )
    faster = [o for o in others if statistics.median(paired_ratios(runs, o, policy, "mean_latency_s")) > 1.0]
    slower = [o for o in others if o not in faster]
    latency = [f"lower than {_join([o + chr(39) + 's' for o in faster])}" if faster else ""]
    latency.append(f"not lower than {_join([o + chr(39) + 's' for o in slower])}" if slower else "")
    return f"In short: {'; '.join(said)}; its mean latency (median) was {', '.join(w for w in latency if w)}."


def _differences(runs: Sequence[Run], policy: str, other: str) -> list[float]:
    by = {(r.policy, r.repetition): r.hit_rate for r in runs}
    reps = sorted({r.repetition for r in runs if r.policy == policy})
    return [by[(policy, i)] - by[(other, i)] for i in reps if (other, i) in by]


def _join(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
