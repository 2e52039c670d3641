"""Forecast accuracy of every predictor on every generated family, on held-out traces.

    .venv/bin/python benchmarks/predictors.py      # a few minutes on 2 cores

Each family is generated with the suite's GENERATED knobs: the training traces
with seeds TRAIN_SEEDS, the test trace with the suite's own seed (the one the
replay benchmarks use). The neural predictor is trained on the training traces
(one model per family); the online predictors observe them in order first and
then score the test trace prequentially, like the policy would run them.
Writes docs/results/predictors.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from dataclasses import replace
from pathlib import Path

from pages import RESULTS, save, template
from rich.console import Console
from rich.table import Table
from suite import GENERATED, mean_prompt

from agentcache.policy.pbkv import DEFAULT_ORDER
from agentcache.predictor import Predictor, PredictorSpec
from agentcache.predictor.base import DEFAULT_HORIZON
from agentcache.predictor.markov import SERVING_REFRESH_EVERY, SERVING_REFRESH_SHARE
from agentcache.predictor.training import Evaluation, TrainConfig, evaluate, train_neural, warm_up
from agentcache.trace import Trace
from agentcache.workloads import generate

FAMILIES = ["code-retry", "fact-verify", "pipeline", "group-chat"]
SPECS = ["markov", "markov-n:2", "markov-n:3", f"markov-n:{DEFAULT_ORDER}", "static", "neural"]
TRAIN_SEEDS = (101, 102, 103)


REPLAY_SPECS = [
    "markov",
    "markov-n:3",
    f"markov-n:{DEFAULT_ORDER}",
    "neural",
]  # forecasters pbkv runs with in the replay comparison, its default among them


def run(families: list[str], epochs: int) -> tuple[dict[str, list[Evaluation]], dict[str, dict[str, float]]]:
    console = Console(stderr=True)
    results: dict[str, list[Evaluation]] = {}
    replays: dict[str, dict[str, float]] = {}
    for family in families:
        train = [generate(family, replace(GENERATED, seed=seed)) for seed in TRAIN_SEEDS]
        test = generate(family, GENERATED)
        console.print(f"[bold]{family}[/bold]: training the neural predictor")
        neural, _ = train_neural(train, DEFAULT_HORIZON, TrainConfig(epochs=epochs))
        results[family] = []
        for spec in SPECS:
            predictor = (
                neural
                if spec == "neural"
                else PredictorSpec.parse(spec).build(test.meta.call_graph, horizon=DEFAULT_HORIZON)
            )
            warm_up(predictor, train)
            results[family].append(evaluate(predictor, test, spec))
        console.print(table(family, results[family]))
        replays[family] = replay_with(test, neural)
        console.print(replays[family])
    return results, replays


def replay_with(test: Trace, neural: Predictor) -> dict[str, float]:
    """pbkv's hit rate on the test trace, at 4x its mean prompt, with each forecaster (cold online ones)."""
    from agentcache.replay.runner import PreparedTrace, replay_policy

    prepared = PreparedTrace(test)
    capacity = int(mean_prompt(test) * 4)
    out = {"capacity": capacity, "lru": replay_policy(prepared, "lru", capacity).hit_rate}
    for spec in REPLAY_SPECS:
        predictor = (
            neural
            if spec == "neural"
            else PredictorSpec.parse(spec).build(test.meta.call_graph, horizon=DEFAULT_HORIZON)
        )
        out[f"pbkv+{spec}"] = replay_policy(prepared, "pbkv", capacity, predictor=predictor).hit_rate
    out["belady"] = replay_policy(prepared, "belady", capacity).hit_rate
    return out


def table(family: str, evaluations: list[Evaluation]) -> Table:
    t = Table(title=family)
    t.add_column("predictor")
    for k in range(1, DEFAULT_HORIZON + 1):
        t.add_column(f"top-1 k={k}", justify="right")
    for k in range(1, DEFAULT_HORIZON + 1):
        t.add_column(f"log-loss k={k}", justify="right")
    t.add_column("ms", justify="right")
    for e in evaluations:
        t.add_row(e.predictor, *_cells(e))
    return t


def _cells(e: Evaluation) -> list[str]:
    return [f"{x:.3f}" for x in e.top1] + [f"{x:.3f}" for x in e.log_loss] + [f"{e.infer_ms:.3f}"]


def markdown(results: dict[str, list[Evaluation]], epochs: int, seconds: float) -> str:
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines = [
        "# Predictor accuracy",
        "",
        *template(
            "predictors/intro.md",
            workflows=GENERATED.workflows,
            train_seeds=", ".join(map(str, TRAIN_SEEDS)),
            test_seed=GENERATED.seed,
            epochs=epochs,
            refresh_every=SERVING_REFRESH_EVERY,
            refresh_share=SERVING_REFRESH_SHARE,
            order=DEFAULT_ORDER,
            load=load,
        ),
        "",
    ]
    steps = [f"k={k}" for k in range(1, DEFAULT_HORIZON + 1)]
    per_step = " | ".join(steps[1:])
    for family, evaluations in results.items():
        lines += [
            f"## {family}",
            "",
            f"| predictor | top-1 {steps[0]} | {per_step} | log-loss {steps[0]} | {per_step} | ms | cpu ms |",
            "|---|" + "---:|" * (2 * DEFAULT_HORIZON + 2),
        ]
        for e in evaluations:
            lines.append(f"| {e.predictor} | " + " | ".join(_cells(e)) + f" | {e.infer_cpu_ms:.3f} |")
        lines.append("")
    lines += [
        "## Neural minus Markov-1, top-1",
        "",
        "| family | " + " | ".join(steps) + " |",
        "|---|" + "---:|" * DEFAULT_HORIZON,
    ]
    for family, evaluations in results.items():
        by_name = {e.predictor: e for e in evaluations}
        diffs = [n - m for n, m in zip(by_name["neural"].top1, by_name["markov"].top1)]
        lines.append(f"| {family} | " + " | ".join(f"{d:+.3f}" for d in diffs) + " |")
    lines += [
        "",
        f"Written in {seconds:.0f} s on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=FAMILIES)
    parser.add_argument("--epochs", type=int, default=TrainConfig().epochs)
    parser.add_argument("-o", "--output", default=str(RESULTS / "predictors.md"))
    args = parser.parse_args()
    start = time.perf_counter()
    results, replays = run(args.families, args.epochs)
    lines = [
        "",
        "## In the policy: pbkv's replay hit rate with each forecaster",
        "",
        "The same test traces through SGLang's cache at 4x their mean prompt; the online forecasters start cold",
        "(as in a fresh server), the neural one is the model trained above.",
        "",
        "| family | capacity | lru | " + " | ".join(f"pbkv+{s}" for s in REPLAY_SPECS) + " | belady |",
        "|---|---:|---:|" + "---:|" * len(REPLAY_SPECS) + "---:|",
    ]
    for family, r in replays.items():
        cells = [f"{r['lru']:.1%}", *(f"{r[f'pbkv+{s}']:.1%}" for s in REPLAY_SPECS), f"{r['belady']:.1%}"]
        lines.append(f"| {family} | {r['capacity']} | " + " | ".join(cells) + " |")
    page = markdown(results, args.epochs, time.perf_counter() - start) + "\n".join(lines) + "\n"
    output = Path(args.output)
    save(output.stem, lambda _: page, folder=output.parent)


if __name__ == "__main__":
    main()
