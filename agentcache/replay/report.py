"""Showing replay results: a rich table, a hit-rate-over-time plot, a markdown table."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from agentcache.replay.runner import ReplayResult


def _gap(r: ReplayResult) -> str:
    return "" if r.gap_closed is None else f"{r.gap_closed:+.0%}"


def print_table(results: Sequence[ReplayResult], title: str = "", console: Console | None = None) -> None:
    table = Table(title=title)
    for column in (
        "capacity",
        "policy",
        "hit rate",
        "gap closed",
        "recomputed tokens",
        "modelled GPU time (s)",
        "vs lru",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    lru = {r.capacity: r for r in results if r.policy == "lru"}
    for r in results:
        base = lru.get(r.capacity)
        speedup = f"{base.modelled_latency_s / r.modelled_latency_s:.2f}x" if base and r.modelled_latency_s else ""
        table.add_row(
            str(r.capacity),
            r.policy,
            f"{r.hit_rate:.1%}",
            _gap(r),
            f"{r.recomputed_tokens:,}",
            f"{r.modelled_latency_s:,.1f}",
            speedup,
        )
    (console or Console()).print(table)


def markdown_table(results: Sequence[ReplayResult]) -> str:
    lines = ["| capacity | policy | hit rate | gap closed | modelled GPU time (s) |", "|---:|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r.capacity} | {r.policy} | {r.hit_rate:.1%} | {_gap(r)} | {r.modelled_latency_s:,.1f} |")
    return "\n".join(lines)


def plot_timeline(results: Sequence[ReplayResult], path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    capacities = sorted({r.capacity for r in results})
    fig, axes = plt.subplots(len(capacities), 1, figsize=(8, 3.2 * len(capacities)), squeeze=False)
    for ax, capacity in zip(axes[:, 0], capacities):
        for r in results:
            if r.capacity == capacity and r.timeline:
                xs, ys = zip(*r.timeline)
                ax.plot(
                    xs,
                    [100 * y for y in ys],
                    label=f"{r.policy} ({r.hit_rate:.0%})",
                    linestyle="--" if r.policy == "belady" else "-",
                )
        ax.set_title(f"{title}, capacity {capacity} tokens")
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("hit rate (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
