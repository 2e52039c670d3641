"""A bench's runs in words and a plot: medians with their range, and ours against SGLang's strategies."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from agentcache.bench.forms import VIA
from agentcache.bench.runner import best_sglang_strategy, runs_on_plain_sglang
from agentcache.bench.runs import Run, paired_ratios
from agentcache.policy import PolicySpec


def median_range(values: Sequence[float], fmt: str, unit: str = "") -> str:
    """`median [min-max]` of repeated measurements, each number in format `fmt`, `unit` after the median."""
    return f"{statistics.median(values):{fmt}}{unit} [{min(values):{fmt}}-{max(values):{fmt}}]"


def plot(runs: Sequence[Run], path: str, title: str) -> None:
    """Distributions of time to first token and request latency per policy, over all its repetitions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r.policy for r in runs))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, metric, label in ((axes[0], "ttft_s", "time to first token (s)"), (axes[1], "latency_s", "latency (s)")):
        data = [[getattr(s, metric) for r in runs if r.policy == p for s in r.sent] for p in policies]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(policies) + 1), policies)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def comparisons(runs: Sequence[Run], ours: str = "pbkv") -> list[str]:
    """Plain sentences: `ours` against each of SGLang's strategies that ran (its session caches included) and each
    variant of ours (pbkv/-tools: without what tool events tell it; pbkv via dynamo: its workflows named in
    another client's form), per repetition, and which of SGLang's was best."""
    policies = list(dict.fromkeys(r.policy for r in runs))
    if ours not in policies:
        return []
    builtins = [p for p in policies if p != ours and VIA not in p and runs_on_plain_sglang(PolicySpec.parse(p))]
    variants = [p for p in policies if p.startswith((f"{ours}/", f"{ours}{VIA}"))]
    after_tools = any(r.post_tool_requests for r in runs if r.policy == ours)
    lines = []
    for base in [*builtins, *variants]:
        tokens = paired_ratios(runs, ours, base, "computed_prompt_tokens")
        ttft = paired_ratios(runs, ours, base, "ttft_s")
        makespan = paired_ratios(runs, ours, base, "makespan_s")
        fewer = sum(t < 1.0 for t in tokens)
        each = ", ".join(f"{t:.2f}x" for t in tokens)
        after_tool = ""
        if after_tools:
            post = paired_ratios(runs, ours, base, "post_tool_ttft_p90_s")
            after_tool = f", p90 time to first token after a tool {median_range(post, '.2f', 'x')}"
        lines.append(
            f"{ours} vs {base}: computed {statistics.median(tokens):.2f}x the prompt tokens (fewer in {fewer} of "
            f"{len(tokens)} repetitions: {each}); time to first token {median_range(ttft, '.2f', 'x')}{after_tool},"
            f" completion time {median_range(makespan, '.2f', 'x')} (medians of per-repetition ratios, [min-max])"
        )
    best = best_sglang_strategy(runs, besides=("lru", ours))
    if best is not None:
        lines.append(f"best of SGLang's other strategies by hit rate: {best}")
    return lines
