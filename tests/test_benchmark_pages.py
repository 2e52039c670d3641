"""Benchmark pages are their figures: each committed page is what its script writes from the JSON beside it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))


def written_page(name: str) -> tuple[str, dict[str, str]]:
    """docs/results/NAME.md as its script writes it, and the command and commit its provenance lines name."""
    from pages import unstamped

    page, made = unstamped((DOCS / f"{name}.md").read_text())
    assert made, f"{name}.md does not say the command and commit that made it"
    return page, {"command": made["command"], "commit": made["commit"]}


def provenance_of(figures: dict) -> dict[str, str]:
    return {"command": figures["command"], "commit": figures["commit"]}


def test_serving_time_page_is_its_figures():
    import serving_time

    figures = json.loads((DOCS / "serving-time.json").read_text())
    page, made = written_page("serving-time")
    assert serving_time.markdown(figures["rows"], figures["seconds"]) == page
    assert made == provenance_of(figures)
    # Every point has every policy at every pace.
    for row in figures["rows"]:
        assert set(row["runs"]) == set(serving_time.POLICIES)
        assert all(len(runs) == len(serving_time.PACES) for runs in row["runs"].values())


def test_scale_out_pages_are_their_figures():
    import scale_out

    for name in ("scale-out", "scale-out-seed-11", "scale-out-seed-22"):
        figures = json.loads((DOCS / f"{name}.json").read_text())
        page, made = written_page(name)
        assert scale_out.page_of(figures) == page, name
        assert made == provenance_of(figures), name
        # Every row has every routing at every pace.
        for row in figures["rows"]:
            assert [pace["pace"] for pace in row["paces"]] == list(scale_out.PACES)
            for pace in row["paces"]:
                assert [run["routing"] for run in pace["runs"]] == list(scale_out.ROUTINGS)


def test_scale_out_tiles_every_event_of_a_trace_with_tool_calls():
    """Each copy has its own workflows: requests, ends and tool calls alike, at the copy's times."""
    import scale_out

    from agentcache.trace import ToolEvent
    from agentcache.workloads import GenConfig, generate

    trace = generate("tool-use", GenConfig(workflows=4, seed=1))
    tiled = scale_out.tiled(trace, 3)
    assert len(tiled.events) == 3 * len(trace.events)
    assert sorted(type(e).__name__ for e in tiled.events) == sorted(3 * [type(e).__name__ for e in trace.events])
    tools = [e for e in tiled.events if isinstance(e, ToolEvent)]
    assert {e.workflow for e in tools} <= {e.workflow for e in tiled.requests} and len(tools) == 3 * sum(
        isinstance(e, ToolEvent) for e in trace.events
    )


def test_scale_out_verdicts_are_on_the_medians_over_the_paces():
    """workflow-aware ahead of both baselines at the calibrated pace alone, behind 1% either side: the row's
    verdict is the medians', and the page says which paces it held at."""
    import scale_out
    from pages import template

    def runs(aware_ahead: bool) -> list[dict]:
        figures = {"hit_rate": 0.5, "ttft_p50_s": 0.1, "ttft_p90_s": 1.0, "throughput_rps": 3.0}
        figures |= {"imbalance": 1.0, "utilization": 0.9}
        aware = {"hit_rate": 0.6, "ttft_p90_s": 0.5} if aware_ahead else {"hit_rate": 0.4, "ttft_p90_s": 2.0}
        return [{"routing": r, **figures, **(aware if r == "workflow-aware" else {})} for r in scale_out.ROUTINGS]

    paces = [{"pace": pace, "runs": runs(aware_ahead=pace == 1.0)} for pace in scale_out.PACES]
    row = {"trace": "chat", "copies": 1, "instances": 2, "capacity": 1000, "time_scale": 0.5, "paces": paces}
    page = scale_out.markdown([row], "python benchmarks/scale_out.py", "pbkv", 1.0, None, "test")
    assert (
        "**Outcome: on the medians, the Done-when holds on 0 of 1 rows** (hit rate: 0 of 1; p90 TTFT: 0 of 1)" in page
    )
    assert (
        "At each pace apart: 0 at 0.99, 1 at 1, 0 at 1.01; at all three: 0, at none: 0 (rows whose verdict changes"
        in page
    )
    assert "| 40.0% · 0.1 / 2 · 3.0 | no | no | no / yes / no |" in page
    assert "- chat N=2: loses on hit rate and p90 TTFT (hit 40.00% vs ca 50.00%; p90 2 s vs ca 1 s, wfa 1 s)." in page
    # The suite page's history of its own rows is not a held-out seed's.
    held_out = scale_out.markdown([row], "python benchmarks/scale_out.py --seed 11", "pbkv", 1.0, 11, "test")
    history = "\n".join(template("scale-out/history.md"))
    assert history in page and history not in held_out


def test_live_vs_replay_page_is_its_figures():
    import live_vs_replay

    saved = json.loads((DOCS / "live-vs-replay.json").read_text())
    page, made = written_page("live-vs-replay")
    assert [row["page"] for row in saved["rows"]] == [page.name for page in live_vs_replay.PAGES]
    assert live_vs_replay.page_of(saved) == page
    assert made == provenance_of(saved)


def test_heldout_page_is_its_figures():
    import heldout

    saved = json.loads((DOCS / "heldout.json").read_text())
    page, made = written_page("heldout")
    assert heldout.page_of(saved) == page
    assert made == provenance_of(saved)
    assert {(row["family"], row["seed"]) for row in saved["rows"]} == {
        (family, seed) for family in heldout.FAMILIES for seed in heldout.SEEDS
    }


def test_live_regime_page_is_its_figures():
    import live_regime

    saved = json.loads((DOCS / "live-regime.json").read_text())
    page, made = written_page("live-regime")
    assert live_regime.markdown(saved["rows"], saved["command"], saved["pace"]) == page
    assert made == provenance_of(saved)
    assert {(row["family"], row["seed"]) for row in saved["rows"]} == {
        (family, seed) for family in live_regime.FAMILIES for seed in live_regime.SEEDS
    }
    assert all(set(row["hit_rate"]) == set(live_regime.COLUMNS) for row in saved["rows"])


def test_gpu_anchor_page_is_its_figures():
    import gpu_anchor

    figures = json.loads((DOCS / "gpu-anchor.json").read_text())
    assert figures["device"].startswith("NVIDIA")
    page, made = written_page("gpu-anchor")
    assert gpu_anchor.render(figures) == page
    assert made == provenance_of(figures)


def test_every_result_page_says_what_made_it():
    for page in DOCS.glob("*.md"):
        if page.name != "README.md":
            written_page(page.stem)


def test_ladder_page_is_its_figures():
    import ladder

    saved = json.loads((DOCS / "benchmarks.json").read_text())
    page, made = written_page("benchmarks")
    assert ladder.page_of(saved) == page
    assert made == provenance_of(saved)


def test_live_bench_pages_are_their_figures():
    import shlex

    import live_bench

    for name in ("live-bench", "live-bench-chat", "live-bench-full-prompts", "live-bench-phased-chat"):
        saved = json.loads((DOCS / f"{name}.json").read_text())
        page, made = written_page(name)
        extra = shlex.split(saved["command"])[2:]  # the arguments the page was made with
        assert live_bench.page_name(extra) == name
        assert live_bench.markdown(saved["policies"], extra) == page, name
        assert made == provenance_of(saved), name


def test_every_result_json_says_what_made_it():
    for figures in DOCS.glob("*.json"):
        saved = json.loads(figures.read_text())
        assert isinstance(saved, dict) and {"commit", "command"} <= set(saved), figures.name
        # A page two writers share names both on its stamp line: this JSON's writer is one of them.
        page = (DOCS / f"{figures.stem}.md").read_text()
        assert f"`{saved['command']}` at commit `{saved['commit']}`" in page, figures.name


def test_a_stamped_page_is_unstamped_back_and_every_template_is_used():
    from pages import HERE, TEMPLATES, stamped, unstamped

    body = "# Title\n\nCommand: `x`.\n\nText.\n"
    for saved in (
        {"command": "python benchmarks/x.py --seed 1", "commit": "1a2b3c4"},
        {"command": "python benchmarks/x.py", "commit": "1a2b3c4-dirty", "stale": "made before 9a13663."},
    ):
        assert unstamped(stamped(body, saved)) == (body, saved)
    assert unstamped(body) == (body, None)
    writers = "".join(path.read_text() for path in HERE.glob("*.py"))
    for path in TEMPLATES.rglob("*.md"):
        assert f'"{path.relative_to(TEMPLATES)}"' in writers, f"{path} is no writer's template"


def test_live_ordered_pairs_leave_overlapping_repetitions_unordered():
    from live_vs_replay import agreeing, live_ordered_pairs

    live = {"a": [0.50, 0.52], "b": [0.51, 0.53], "c": [0.60, 0.61]}
    pairs = live_ordered_pairs(live)
    assert sorted(pairs) == [("a", "c"), ("b", "c")]  # a and b overlap: the live runs do not order them
    assert agreeing(pairs, {"a": 0.4, "b": 0.3, "c": 0.5}) == 2
    assert agreeing(pairs, {"a": 0.6, "b": 0.3, "c": 0.5}) == 1
