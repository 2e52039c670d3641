"""Benchmark pages are their figures: each committed page is what its script writes from the JSON beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_serving_time_page_is_its_figures():
    import serving_time

    figures = json.loads((DOCS / "serving-time.json").read_text())
    page = serving_time.markdown(figures["rows"], figures["seconds"])
    assert page == (DOCS / "serving-time.md").read_text()
    # Every point has every policy at every pace.
    for row in figures["rows"]:
        assert set(row["runs"]) == set(serving_time.POLICIES)
        assert all(len(runs) == len(serving_time.PACES) for runs in row["runs"].values())


def test_scale_out_pages_are_their_figures():
    import cluster

    for name in ("scale-out", "scale-out-seed-11", "scale-out-seed-22"):
        figures = json.loads((DOCS / f"{name}.json").read_text())
        assert cluster.page_of(figures) == (DOCS / f"{name}.md").read_text(), name
        for row in figures["rows"]:
            assert [run["routing"] for run in row["runs"]] == list(cluster.ROUTINGS)


def test_scale_out_page_at_another_pace_says_so():
    import cluster

    figures = json.loads((DOCS / "scale-out.json").read_text())
    figures["pace"] = 1.001
    page = cluster.page_of(figures)
    assert "Every row's arrivals 1.001x as fast as the pace its calibration found" in page
    # The suite page's reading of its own rows (variants tried, the pace check) is not this run's.
    assert cluster.PACE_CHECK[0] not in page and cluster.FEWER_HOMES[0] not in page
    assert cluster.PACE_CHECK[0] in (DOCS / "scale-out.md").read_text()


def test_live_vs_replay_page_is_its_figures():
    import live_vs_replay

    rows = json.loads((DOCS / "live-vs-replay.json").read_text())
    assert [row["page"] for row in rows] == [page.name for page in live_vs_replay.PAGES]
    assert live_vs_replay.markdown(rows) == (DOCS / "live-vs-replay.md").read_text()


def test_heldout_page_is_its_figures():
    import heldout

    rows = json.loads((DOCS / "heldout.json").read_text())
    assert heldout.markdown(rows, heldout.COMMAND) == (DOCS / "heldout.md").read_text()
    assert {(row["family"], row["seed"]) for row in rows} == {
        (family, seed) for family in heldout.FAMILIES for seed in heldout.SEEDS
    }


def test_live_ordered_pairs_leave_overlapping_repetitions_unordered():
    from live_vs_replay import agreeing, live_ordered_pairs

    live = {"a": [0.50, 0.52], "b": [0.51, 0.53], "c": [0.60, 0.61]}
    pairs = live_ordered_pairs(live)
    assert sorted(pairs) == [("a", "c"), ("b", "c")]  # a and b overlap: the live runs do not order them
    assert agreeing(pairs, {"a": 0.4, "b": 0.3, "c": 0.5}) == 2
    assert agreeing(pairs, {"a": 0.6, "b": 0.3, "c": 0.5}) == 1
