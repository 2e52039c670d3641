"""Showing replay results: a rich table and a hit-rate-over-time plot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rich.console import Console
from rich.table import Table
from rich.text import Text

from agentcache.replay.results import UNLIMITED, ReplayResult

NAME_COLUMNS = ("policy", "routing")  # columns of names, aligned left (figures align right)


def print_fitted_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], console: Console | None = None
) -> None:
    """Print a table no cell of which is cut. rich fits a table to the terminal (80 columns when the output
    is a file or a pipe) by cutting cells ("cachesco…", "12.…"); here each column is as wide as its widest
    cell and its header, or where that does not fit, its header's longest word (the header folds), and a
    table wider than the terminal even so is printed whole. Names (policy, routing) align left, figures right.
    Title and cells are plain text, never rich markup: "[min-max]" or a trace named "[/]" shows as written."""
    console = console or Console()
    cells = [max((len(row[i]) for row in rows), default=0) for i in range(len(headers))]
    widths = [max(cell, len(header)) for cell, header in zip(cells, headers)]
    if _table_width(widths) > console.width:
        widths = [max([cell] + [len(word) for word in header.split()]) for cell, header in zip(cells, headers)]
    table = Table(title=Text(title))
    for header, width in zip(headers, widths):
        table.add_column(header, justify="left" if header in NAME_COLUMNS else "right", width=width, overflow="fold")
    for row in rows:
        table.add_row(*map(Text, row))
    needed = _table_width(widths)
    if needed <= console.width:
        console.print(table)
        return
    terminal = console.width  # print(width=) cannot exceed the console's own width: widen it for this table
    console.width = needed
    try:
        console.print(table, crop=False)
    finally:
        console.width = terminal


def _table_width(widths: Sequence[int]) -> int:
    """A rich table's width: the left edge, and per column its width, its padding (2) and a border (1)."""
    return 1 + sum(width + 3 for width in widths)


def _gap(r: ReplayResult) -> str:
    return "" if r.gap_closed is None else f"{r.gap_closed:+.0%}"


def best_of_group(results: Sequence[ReplayResult], group: Sequence[str]) -> list[ReplayResult]:
    """The results as a table shows them: at each capacity, the group's runs (SGLang's strategies) as one row,
    the one that hit most, named `best built-in: <strategy>`, where the group's first run was."""
    if not group:
        return list(results)
    best = {}
    for r in results:
        if r.policy in group and (r.capacity not in best or r.hit_rate > best[r.capacity].hit_rate):
            best[r.capacity] = r
    shown, placed = [], set()
    for r in results:
        if r.policy not in group:
            shown.append(r)
        elif r.capacity not in placed:
            placed.add(r.capacity)
            shown.append(replace(best[r.capacity], policy=f"best built-in: {best[r.capacity].policy}"))
    return shown


def print_table(results: Sequence[ReplayResult], title: str = "", console: Console | None = None) -> None:
    lru = {r.capacity: r for r in results if r.policy == "lru"}
    rows = []
    for r in results:
        base = lru.get(r.capacity)
        speedup = f"{base.modelled_latency_s / r.modelled_latency_s:.2f}x" if base and r.modelled_latency_s else ""
        rows.append(
            (
                str(r.capacity),
                r.policy,
                f"{r.hit_rate:.1%}",
                _gap(r),
                f"{r.recomputed_tokens:,}",
                f"{r.modelled_latency_s:,.1f}",
                speedup,
            )
        )
    headers = ("capacity", "policy", "hit rate", "gap closed", "recomputed tokens", "modelled GPU time (s)", "vs lru")
    print_fitted_table(title, headers, rows, console)


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
                    linestyle={"belady": "--", UNLIMITED: ":"}.get(r.policy, "-"),  # the two references
                )
        ax.set_title(f"{title}, capacity {capacity} tokens")
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("hit rate (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
