"""What each ingredient of the default pbkv is worth, on every trace of the suite at three capacities.

    .venv/bin/python benchmarks/ablation.py        # about 10 minutes on 2 cores

Each row switches one ingredient off (or, for `cost`, on) from the default, so
the column says what the ingredient adds; LRU, the best SGLang built-in and
the offline reference (belady) sit beside them. Writes docs/results/ablation.md and docs/results/ablation.json.
"""

from __future__ import annotations

import argparse

from pages import progress, save, template
from suite import suite

from agentcache.replay.runner import PreparedTrace, fill_gap_closed, replay_policy

BUILTINS = [
    "lfu",
    "slru",
    "priority",
    "fifo",
    "mru",
    "filo",
]  # tlru (no budget) is lru; priority/fifo/mru/filo rarely win
VARIANTS = {
    "lifecycle": "lifecycle only (PBKV-LAE)",
    "pbkv-paper": "PBKV's score as written",
    "pbkv/-fixed-by-forecast": "- fixed prompts valued by every active workflow",
    "pbkv/-arrivals": "- calls of workflows not yet started",
    "pbkv/-timing": "- time to each workflow's next request",
    "pbkv/-evidence": "- per-node reuse evidence",
    "pbkv/-fallback": "- frequency order where no forecast values a node",
    "pbkv/-reuse": "- each agent's learned reuse of its last path (context, fresh prompt, output)",
    "pbkv/-lifecycle": "- retired tier",
    "pbkv/-retired-evidence": "- nodes worth less than retired cache's reads ranked with it",
    "pbkv/-retired-ages": "- retired nodes valued by their age (EVA) instead of LRU within the tier",
    "pbkv/+cost": "+ miss cost per token (context length)",
    "pbkv": "default",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*")
    args = parser.parse_args()
    policies = ["lru", *VARIANTS, *BUILTINS, "belady"]
    traces = list(suite(args.only))
    rows, records = [], []
    with progress("ablation", sum(len(t.trace.requests) * len(t.capacities) * len(policies) for t in traces)) as bar:
        for st in traces:
            prepared = PreparedTrace(st.trace)
            results = [replay_policy(prepared, p, c, on_request=bar.advance) for c in st.capacities for p in policies]
            fill_gap_closed(results)
            for capacity in st.capacities:
                by = {r.policy: r for r in results if r.capacity == capacity}
                builtin = max((by[b] for b in BUILTINS), key=lambda r: r.hit_rate)
                rows.append((st.name, capacity, by, builtin))
            records += [{"trace": st.name, **r.to_json()} for r in results]

    lines = [
        "# Ablation: what each ingredient of the default pbkv adds",
        "",
        *template("ablation/intro.md", builtins=", ".join(BUILTINS)),
        "",
        *(f"- `{variant}`: {label}" for variant, label in VARIANTS.items()),
        "",
        "| trace | capacity | lru | " + " | ".join(f"`{v}`" for v in VARIANTS) + " | best built-in | belady |",
        "|---|---:|" + "---:|" * (len(VARIANTS) + 3),
    ]

    def cell(r):  # noqa: ANN001
        return f"{r.hit_rate:.1%}" + (
            "" if r.gap_closed is None or r.policy in ("lru", "belady") else f" ({r.gap_closed:+.0%})"
        )

    for name, capacity, by, builtin in rows:
        cells = [
            cell(by["lru"]),
            *(cell(by[v]) for v in VARIANTS),
            f"{builtin.policy} {cell(builtin)}",
            cell(by["belady"]),
        ]
        lines.append(f"| {name} | {capacity} | " + " | ".join(cells) + " |")
    worst = min(by["pbkv"].hit_rate - b.hit_rate for _, _, by, b in rows)
    lines += [
        "",
        f"Default pbkv minus the best built-in, worst case over all {len(rows)} columns: {worst * 100:+.2f} points.",
        "",
    ]
    save("ablation", lambda _: "\n".join(lines), {"runs": records})


if __name__ == "__main__":
    main()
