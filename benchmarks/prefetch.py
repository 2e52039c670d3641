"""The ladder's last rung: prefetch from the host tier, conservative vs aggressive vs none, under forecast noise.

    .venv/bin/python benchmarks/prefetch.py        # about 15 minutes on 2 cores

Every trace replays through SGLang's cache with a HiCache host tier twice the
device capacity (device: 4x the trace's mean prompt), with pbkv and no
prefetch, conservative prefetch (idle space and idle bandwidth only) and
aggressive prefetch (may evict active cache), while pbkv's forecasts are
mixed with uniform noise, P' = (1 - lambda) P + lambda U. Writes
docs/results/prefetch.md, docs/results/prefetch.json and docs/results/img/prefetch-noise.png.
"""

from __future__ import annotations

import argparse

from pages import RESULTS, progress, save, template
from suite import GENERATED, mean_prompt

from agentcache.predictor import PredictorSpec
from agentcache.replay.runner import PreparedTrace, replay_policy
from agentcache.workloads import DYNAMIC_FAMILIES, generate

LAMBDAS = (0.0, 0.1, 0.2, 0.3, 0.5)
VARIANTS = ("pbkv", "pbkv+prefetch", "pbkv+prefetch-aggressive")
WORKFLOWS = 80  # fewer than the ladder: aggressive prefetch moves a lot of KV


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="*", default=list(DYNAMIC_FAMILIES))
    args = parser.parse_args()
    records = []
    cfg = GENERATED.__class__(**{**GENERATED.knobs(), "workflows": WORKFLOWS})
    with progress("prefetch", len(args.families) * (len(LAMBDAS) * len(VARIANTS) + 1)) as bar:
        for family in args.families:
            trace = generate(family, cfg)
            prepared = PreparedTrace(trace)
            capacity = int(mean_prompt(trace) * 4)
            host = 2 * capacity
            lru = replay_policy(prepared, "lru", capacity, host_capacity=host)
            records.append({"family": family, "noise": None, **lru.to_json()})
            bar.advance()
            for lam in LAMBDAS:
                for variant in VARIANTS:
                    predictor = PredictorSpec.parse(f"noise:{lam}:markov" if lam else "markov").build()
                    r = replay_policy(prepared, variant, capacity, host_capacity=host, predictor=predictor)
                    records.append({"family": family, "noise": lam, **r.to_json()})
                    bar.advance()

    lines = [
        "# Prefetch from the host tier under forecast noise",
        "",
        *template("prefetch/intro.md", workflows=WORKFLOWS),
        "",
        "| family | lambda | lru | pbkv | + conservative prefetch | + aggressive prefetch | conservative: prefetched / used | aggressive: prefetched / used |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for family in args.families:
        rows = [r for r in records if r["family"] == family]
        lru = next(r for r in rows if r["noise"] is None)
        for lam in LAMBDAS:
            by = {r["policy"]: r for r in rows if r["noise"] == lam}
            cells = [f"{r['modelled_latency_s']:.1f} ({r['hit_rate']:.1%})" for r in (lru, *(by[v] for v in VARIANTS))]
            pf = [f"{by[v]['prefetched_tokens']:,} / {by[v]['prefetch_used_tokens']:,}" for v in VARIANTS[1:]]
            lines.append(f"| {family} | {lam} | " + " | ".join(cells + pf) + " |")
    worst = min(
        next(r for r in records if r["family"] == f and r["noise"] == lam and r["policy"] == "pbkv")[
            "modelled_latency_s"
        ]
        - next(r for r in records if r["family"] == f and r["noise"] == lam and r["policy"] == "pbkv+prefetch")[
            "modelled_latency_s"
        ]
        for f in args.families
        for lam in LAMBDAS
    )
    lines += [
        "",
        f"Conservative prefetch vs none, smallest GPU time saved over every family and lambda: {worst:+.2f} s.",
        "",
    ]
    save("prefetch", lambda _: "\n".join(lines), {"runs": records})
    _plot(records, args.families)


def _plot(records: list[dict], families: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(families), figsize=(4.2 * len(families), 3.4), squeeze=False)
    for ax, family in zip(axes[0], families):
        for variant, style in zip(VARIANTS, ("-", "-o", "--x")):
            ys = [
                next(r for r in records if r["family"] == family and r["noise"] == lam and r["policy"] == variant)[
                    "modelled_latency_s"
                ]
                for lam in LAMBDAS
            ]
            ax.plot(LAMBDAS, ys, style, label=variant)
        ax.set_title(family)
        ax.set_xlabel("forecast noise lambda")
        ax.set_ylabel("modelled GPU time (s)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "img" / "prefetch-noise.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
