"""The live benchmark's default run, written into docs/results/live-bench.md and its table in docs/results/README.md.

    .venv/bin/python benchmarks/live_bench.py        # about 15 minutes on 2 cores
    .venv/bin/python benchmarks/live_bench.py --family phased-chat --workflows 8   # a rebuilding workload

Runs `agentcache bench --json --plot docs/results/img/live-bench.png` (its defaults: a generated group chat,
lru, lfu, session-lfu and pbkv, 3 repetitions, each on a fresh warmed-up server, in alternating order; SGLang's
strategies and its session cache on plain SGLang), shows its progress and table as it goes, and writes what its JSON line says.
Extra arguments go to `agentcache bench`; with `--family F` (other than the default group chat) the
page is docs/results/live-bench-F.md and its table in docs/results/README.md sits between its own markers; `--page NAME`
(not passed on) names the page docs/results/live-bench-NAME.md instead, for a run that differs in other arguments:

    .venv/bin/python benchmarks/live_bench.py --page full-prompts --token-scale 1.0   # prompts at full size
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys

from pages import RESULTS, ROOT, load, provenance, render_again, save, template, write_between_markers

from agentcache.bench.runner import runs_on_plain_sglang
from agentcache.policy import PolicySpec


def ratio(summary: dict, policy: str, base: str, metric: str) -> list[float]:
    """Per repetition (runs of one repetition ran next to each other), `policy`'s metric over `base`'s."""
    mine = {r["repetition"]: r[metric] for r in summary[policy]["repetitions"]}
    theirs = {r["repetition"]: r[metric] for r in summary[base]["repetitions"]}
    return [mine[i] / theirs[i] for i in sorted(mine) if theirs.get(i)]


def cell(spread: dict) -> str:
    return f"{spread['median']:.2f} [{spread['min']:.2f}-{spread['max']:.2f}]"


def table(summary: dict) -> list[str]:
    lines = [
        "| policy | hit rate | prompt tokens computed | time to first token (s) | latency (s) | completion (s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for policy, r in summary.items():
        lines.append(
            f"| {policy} | {r['hit_rate']:.1%} | {r['computed_prompt_tokens']:,.0f} | {cell(r['ttft_s'])} "
            f"| {cell(r['latency_s'])} | {cell(r['makespan_s'])} |"
        )
    return lines


def sglang_strategies(summary: dict) -> list[str]:
    """The run's policies that are SGLang's own (plain SGLang: lru, lfu, ..., and its session caches)."""
    return [p for p in summary if runs_on_plain_sglang(PolicySpec.parse(p))]


def verdicts(summary: dict) -> list[str]:
    """pbkv against each of SGLang's strategies the run has, its session caches included, as medians of
    per-repetition ratios; and which of them hit most."""
    if "pbkv" not in summary:
        return []
    bases = sglang_strategies(summary)
    lines = []
    for base in bases:
        ratios = {
            name: ratio(summary, "pbkv", base, metric)
            for metric, name in (
                ("computed_prompt_tokens", "prompt tokens computed"),
                ("ttft_s", "time to first token"),
                ("makespan_s", "completion time"),
            )
        }
        parts = [f"{name} {statistics.median(r):.2f}x [{min(r):.2f}-{max(r):.2f}]" for name, r in ratios.items()]
        tokens = ratios["prompt tokens computed"]
        fewer = sum(x < 1.0 for x in tokens)
        each = ", ".join(f"{x:.2f}x" for x in tokens)
        lines.append(
            f"- pbkv vs {base}: "
            + ", ".join(parts)
            + f"; fewer prompt tokens computed in {fewer} of {len(tokens)} repetitions ({each})."
        )
    if bases:
        best = max(bases, key=lambda b: summary[b]["hit_rate"])
        lines.append(f"- The best of SGLang's strategies here by hit rate: {best}.")
    return lines


def page_name(extra: list[str]) -> str:
    """live-bench-NAME for `--page NAME`, else live-bench, or live-bench-FAMILY for a generated family other
    than the default."""
    if "--page" in extra[:-1]:
        return f"live-bench-{extra[extra.index('--page') + 1]}"
    family = extra[extra.index("--family") + 1] if "--family" in extra[:-1] else "group-chat"
    return "live-bench" if family == "group-chat" else f"live-bench-{family}"


def bench_arguments(extra: list[str]) -> list[str]:
    """What goes to `agentcache bench`: everything but `--page NAME`."""
    if "--page" not in extra[:-1]:
        return extra
    i = extra.index("--page")
    return extra[:i] + extra[i + 2 :]


def main() -> None:
    extra = sys.argv[1:]
    if {"-h", "--help"} & set(extra):
        print(__doc__)
        return
    if extra[:1] == ["--pages-only"]:  # rewrite the page and its table from the last run's JSON
        name = page_name(extra[1:])
        render_again(name, lambda saved: markdown(saved["policies"], extra[1:]))
        write_table(load(name)["policies"], name)
        return
    name = page_name(extra)
    made = provenance()  # before the bench writes its plot, a tracked file that would make the tree look dirty
    command = [str(ROOT / ".venv/bin/agentcache"), "bench", "--json", "--plot", str(RESULTS / f"img/{name}.png")]
    # stderr: the progress bar
    proc = subprocess.run(command + bench_arguments(extra), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    save(name, lambda saved: markdown(saved["policies"], extra), {**made, "policies": summary})
    write_table(summary, name)


def markdown(summary: dict, extra: list[str]) -> str:
    name = page_name(extra)
    arguments = bench_arguments(extra)
    shown = "agentcache bench " + " ".join(["--json", "--plot", f"docs/results/img/{name}.png", *arguments])
    if name == "live-bench":
        workload = "the default workload (16 generated group-chat workflows: agents append to a shared conversation)"
    elif "--family" in arguments:
        workload = f"generated {name.removeprefix('live-bench-')} workflows (`{' '.join(arguments)}`)"
    else:
        workload = f"the default group chat, run with `{' '.join(arguments)}`"
    page = [
        "# Live benchmark: real requests against the CPU server",
        "",
        f"Command: `{' '.join(['.venv/bin/python benchmarks/live_bench.py', *extra])}` (runs `{shown}`;",
        f"{platform.machine()}, 2 cores, no GPU). Workload: {workload}.",
        "",
        *template("live-bench/method.md"),
        "",
        *table(summary),
        "",
        *verdicts(summary),
        "",
        f"![time to first token and latency](img/{name}.png)",
        "",
        *template("live-bench/notes.md"),
        "",
    ]
    return "\n".join(page)


def write_table(summary: dict, name: str) -> None:
    """The page's table and verdicts in docs/results/README.md, between the page's markers."""
    marker = "live" if name == "live-bench" else name.replace("live-bench", "live")
    lines = table(summary) + ["", *verdicts(summary)]
    write_between_markers(RESULTS / "README.md", marker, "\n".join(lines) + "\n")
    print(f"wrote docs/results/README.md's {marker} table", file=sys.stderr)


if __name__ == "__main__":
    main()
