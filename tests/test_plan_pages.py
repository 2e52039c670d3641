"""The result pages' column for pbkv with the plan (issue 53): shown where a run measured it, never otherwise."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_the_ladder_shows_pbkv_with_the_plan_beside_pbkv_where_the_run_measured_it():
    import ladder

    saved = json.loads((DOCS / "benchmarks.json").read_text())
    saved["runs"] = [r for r in saved["runs"] if r["policy"] != ladder.PLANNED]
    assert ladder.PLANNED not in ladder.page_of(saved), "a run made before the column existed shows none"
    runs = [r for r in saved["runs"] if r["trace"] == "code-retry"]
    pbkv = [r for r in runs if r["policy"] == "pbkv"]
    planned = [{**r, "policy": ladder.PLANNED, "hit_rate": 0.9, "hit_tokens": r["prompt_tokens"] * 0.9} for r in pbkv]
    page = ladder.page_of({**saved, "runs": runs + planned})
    header = next(line for line in page.splitlines() if line.startswith("| trace"))
    assert "| pbkv | pbkv with the plan | belady |" in header
    table = ladder.readme_table(runs + planned)
    assert "| pbkv | pbkv with the plan | offline reference |" in table and "| 90.0% |" in table
    assert ladder.PLANNED not in ladder.readme_table(saved["runs"])


def test_the_live_sized_page_counts_pbkv_with_the_plan_at_or_above_the_best_built_in():
    import live_sized

    saved = json.loads((DOCS / "live-sized.json").read_text())
    rows = [
        {**r, "hit_rate": {p: h for p, h in r["hit_rate"].items() if p != live_sized.PLANNED}}
        for r in saved["rows"][:6]
    ]
    assert live_sized.PLANNED not in live_sized.markdown(rows, "x", [])
    told = [{**r, "hit_rate": {**r["hit_rate"], live_sized.PLANNED: 1.0}} for r in rows]
    page = live_sized.markdown(told, "x", [])
    assert "`pbkv with the plan` >= best built-in" in page and "| 100.0% |" in page


def test_the_heldout_page_gives_the_plan_column_where_measured_and_a_dash_elsewhere():
    import heldout

    saved = json.loads((DOCS / "heldout.json").read_text())
    keys = ("with_plan", "with_plan_gap_closed", "with_plan_margin")
    rows = [{k: v for k, v in r.items() if k not in keys} for r in saved["rows"]]
    for r in rows[:3]:
        r.update(with_plan=0.5, with_plan_gap_closed=0.9, with_plan_margin=0.01)
    page = heldout.markdown(rows, "x", base="abc1234")
    assert "| 50.0% | 90.0% |" in page and "| — | — |" in page
    assert "Every column but pbkv with the plan is from the run at commit `abc1234`" in page
