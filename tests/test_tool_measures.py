"""What issue 52 measures: the time to first token of the calls that follow a tool (each agent's first call after
its tool ended) and each workflow's completion time, in the timed replay and in `agentcache bench`; the bench
tells only the plugin about tool calls."""

from __future__ import annotations

import asyncio
import json

import pytest

from agentcache.bench.runs import TOOL_FIGURES, Run, summarize
from agentcache.bench.workload import Lifecycle, Sent, TokenMaker, Workload
from agentcache.replay.results import calls_after_tools, quantile
from agentcache.replay.runner import PreparedTrace
from agentcache.replay.serving import serve_trace
from agentcache.trace import End, Meta, Request, Segment, ToolEnd, ToolStart, Trace, write_trace
from agentcache.workloads import GenConfig, generate


def call(ts: float, workflow: str, agent: str, *segments: tuple[str, int]) -> Request:
    return Request(ts, workflow, agent, tuple(Segment(c, n) for c, n in segments), 1, 5)


def tiny() -> Trace:
    """Two workflows; in `w`, the coder calls a tool, the reviewer speaks during the pause, then the coder's call
    after the tool (it re-sends its prompt, its answer and the result), then another of its calls; `v` has no
    tool."""
    sys_c, sys_r = ("sys-coder", 200), ("sys-reviewer", 200)
    events = [
        call(0.0, "w", "coder", sys_c, ("task", 100)),  # 0
        ToolStart(1.0, "w", "coder", "run_tests"),
        call(2.0, "w", "reviewer", sys_r, ("look", 50)),  # 1: not the coder's: not after its tool
        call(2.5, "v", "coder", sys_c, ("other", 100)),  # 2: another workflow
        ToolEnd(20.0, "w", "coder", "run_tests"),
        call(20.1, "w", "coder", sys_c, ("task", 100), ("result", 80)),  # 3: after the tool
        call(21.0, "w", "coder", sys_c, ("task", 100), ("result", 80), ("more", 10)),  # 4: no tool since
        End(22.0, "w"),
        End(22.0, "v"),
    ]
    return Trace(Meta(name="tiny-tools"), events)


def test_the_call_after_a_tool_is_its_agents_first_call_after_the_tool_ended():
    assert calls_after_tools(tiny().events) == {3}
    assert calls_after_tools(tiny().without(["tool"]).events) == set()
    trace = generate("tool-use", GenConfig(workflows=6, seed=2))
    ends = sum(isinstance(e, ToolEnd) for e in trace.events)
    assert len(calls_after_tools(trace.events)) == ends > 0, "every tool's end is followed by its agent's call"


def test_the_timed_replay_reports_the_ttft_after_tools_and_workflow_completion():
    result = serve_trace(PreparedTrace(tiny()), "lru", 2000)
    summary = result.summary()
    by_index = {s.index: s for s in result.served}
    assert summary["post_tool_requests"] == 1
    assert summary["post_tool_ttft_p50_s"] == summary["post_tool_ttft_p90_s"] == by_index[3].ttft_s > 0
    spans = sorted(
        [by_index[4].finished - by_index[0].arrival, by_index[2].finished - by_index[2].arrival]
    )  # w: its first call to its last answer; v: its one call
    assert summary["workflow_completion_p50_s"] == quantile(spans, 0.5) == spans[1]
    assert summary["workflow_completion_p90_s"] == spans[1]
    assert spans[0] == pytest.approx(by_index[2].latency_s)
    # the existing figures are still there; a trace without tool events has no call after a tool
    bare = serve_trace(PreparedTrace(tiny().without(["tool"])), "lru", 2000).summary()
    assert bare["post_tool_requests"] == 0 and bare["post_tool_ttft_p90_s"] is None
    assert {k: bare[k] for k in ("hit_rate", "ttft_p50_s", "ttft_p90_s")} == {
        k: summary[k] for k in ("hit_rate", "ttft_p50_s", "ttft_p90_s")
    }


def test_the_timed_replays_percentiles_are_over_the_calls_after_tools_alone():
    trace = generate("tool-use", GenConfig(workflows=12, rate=1.0, seed=3))
    result = serve_trace(PreparedTrace(trace), "lru", 6000, time_scale=0.2)
    marked = calls_after_tools(trace.events)
    ttft = sorted(s.ttft_s for s in result.served if s.index in marked and s.admitted)
    summary = result.to_json()
    assert summary["post_tool_requests"] == len(ttft) > 0
    assert summary["post_tool_ttft_p50_s"] == quantile(ttft, 0.5)
    assert summary["post_tool_ttft_p90_s"] == quantile(ttft, 0.9)
    assert summary["workflow_completion_p90_s"] >= summary["workflow_completion_p50_s"] > 0


def test_replay_timed_prints_the_figures_after_tools_in_its_json_and_table(tmp_path, capsys):
    from agentcache.cli import main

    path = tmp_path / "tools.jsonl"
    write_trace(path, generate("tool-use", GenConfig(workflows=6, rate=1.0, seed=2)))
    argv = ["replay", str(path), "--capacity", "8000", "--policy", "lru,session-lfu,pbkv", "--timed"]
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [r["policy"] for r in rows] == ["lru", "session-lfu", "pbkv"]
    for row in rows:
        assert row["instances"] == 1 and row["post_tool_requests"] > 0
        assert row["post_tool_ttft_p90_s"] >= row["post_tool_ttft_p50_s"] > 0
        assert row["ttft_p50_s"] > 0 and row["workflow_completion_p50_s"] > 0
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "1 worker" in out and "after-tool" in out and "workflow" in out  # headers fold in 80 columns
    assert "routing" not in out and "imbalance" not in out


# ---------------------------------------------------------------- the bench


def sent(workflow: str, at: float, ttft: float, latency: float, after_tool: bool = False) -> Sent:
    return Sent(ttft, latency, 100, 50, workflow=workflow, after_tool=after_tool, sent_s=at)


def test_a_bench_run_reports_the_ttft_after_tools_and_workflow_completion_per_policy():
    calls = [
        sent("a", 0.0, 0.1, 0.2),
        sent("a", 1.0, 0.9, 1.0, after_tool=True),
        sent("b", 0.5, 0.1, 0.3),
        sent("b", 2.0, 0.3, 0.5, after_tool=True),
        sent("b", 3.0, 0.5, 0.6, after_tool=True),
    ]
    run = Run("pbkv", 0, calls, 4.0)
    assert run.post_tool_requests == 3
    assert run.post_tool_ttft_p50_s == 0.5 and run.post_tool_ttft_p90_s == 0.9  # of 0.3, 0.5, 0.9
    assert run.workflow_completion_p50_s == pytest.approx(3.1)  # a: 1.0 + 1.0 - 0; b: 3.0 + 0.6 - 0.5
    assert run.workflow_completion_p90_s == pytest.approx(3.1)
    json_run = run.to_json()
    assert json_run["prompt_tokens"] == 500 and all(name in json_run for name in TOOL_FIGURES)
    plain = Run("lru", 0, [Sent(0.1, 0.2, 100, 0)], 1.0)  # a run that does not say whose calls (the demo's)
    assert plain.post_tool_ttft_p90_s is None and plain.workflow_completion_p90_s is None
    summary = summarize([run, Run("pbkv", 1, calls[:2], 2.0), plain])
    assert summary["pbkv"]["post_tool_ttft_p90_s"] == {"median": 0.9, "min": 0.9, "max": 0.9}
    assert summary["lru"]["post_tool_ttft_p90_s"] is None
    assert set(summary["lru"]) >= {"hit_rate", "ttft_s", "latency_s", "makespan_s", *TOOL_FIGURES}


def test_pbkv_without_tool_events_runs_on_the_plugin_and_is_sent_them_as_pbkv_is():
    """pbkv/-tools is pbkv with its tools ingredient off: the same traffic (tool events included) on the plugin,
    which runs it by that name; SGLang's strategies run on plain SGLang and are sent none."""
    from agentcache.bench.runner import BenchOptions, lifecycle_of, serve_options
    from agentcache.policy import PolicySpec
    from agentcache.server_ext.launcher import sglang_command

    spec = PolicySpec.parse("pbkv/-tools")
    assert spec.ingredients is not None and not spec.ingredients.tools
    assert PolicySpec.parse("pbkv").ingredients.tools
    assert lifecycle_of(spec) is lifecycle_of(PolicySpec.parse("pbkv")) is Lifecycle.PLUGIN
    options = serve_options(spec, BenchOptions(cpu=True), 8000, "run")
    command, _ = sglang_command(options, "/models/m")
    assert options.plugin and command[command.index("--agentcache-policy") + 1] == "pbkv/-tools"
    for builtin in ("lru", "lfu", "session-lfu"):
        assert lifecycle_of(PolicySpec.parse(builtin)) is not Lifecycle.PLUGIN


def test_the_bench_sends_tool_events_to_the_plugin_alone_in_each_workflows_order(recording_server):
    """The plugin hears each tool event on its events route (the wire contract: a list of events, no `ts`), in the
    workflow's order between the calls they separate; plain SGLang and its session cache have no such route."""
    url, heard = recording_server

    def per_workflow(heard: list[tuple[str, dict]]) -> dict[str, list[str]]:
        """What each workflow's coroutine sent, in order: its calls, tool events and end."""
        out: dict[str, list[str]] = {}
        for path, body in heard:
            if path == "/generate":
                workflow, kind = body["sampling_params"]["custom_params"]["agentcache"]["workflow"], "request"
            elif path == "/agentcache/v1/events":
                workflow, kind = body["events"][0]["workflow"], body["events"][0]["type"]
            else:
                workflow, kind = path.split("/")[-2], "end"
            out.setdefault(workflow, []).append(kind)
        return out

    def per_workflow_in(trace: Trace) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for e in trace.events:
            kind = "request" if isinstance(e, Request) else "end" if isinstance(e, End) else e.TYPE
            out.setdefault(e.workflow, []).append(kind)
        return out

    trace = generate("tool-use", GenConfig(workflows=3, seed=1))
    answers = {}
    for lifecycle in Lifecycle:
        heard.clear()
        workload = Workload(trace, TokenMaker(675, 0.05), time_scale=0.0, max_new_tokens=1)
        answers[lifecycle], _ = asyncio.run(workload.drive(url, {}, lifecycle=lifecycle))
        events = [body for path, body in heard if path == "/agentcache/v1/events"]
        if lifecycle is not Lifecycle.PLUGIN:
            assert events == [], f"{lifecycle}: no events route"
            continue
        tools = [e for e in trace.events if isinstance(e, (ToolStart, ToolEnd))]
        assert all(len(body["events"]) == 1 for body in events)
        posted = [body["events"][0] for body in events]
        assert sorted(map(json.dumps, posted)) == sorted(
            json.dumps({"type": e.TYPE, "workflow": e.workflow, "agent": e.agent, "tool": e.tool}) for e in tools
        )
        assert per_workflow(heard) == per_workflow_in(trace), "each workflow's in order, between its calls"
    for lifecycle, calls in answers.items():
        assert sum(s.after_tool for s in calls) == len(calls_after_tools(trace.events)) > 0, lifecycle
        assert {s.workflow for s in calls} == {r.workflow for r in trace.requests}


@pytest.mark.server
def test_a_bench_run_tells_the_live_plugin_every_tool_event(server):
    """Against the real server with the plugin: every tool event of the workload is accepted and counted."""
    from agentcache.bench.runner import vocab_size_of
    from agentcache.server_ext.launcher import ensure_model

    trace = generate("tool-use", GenConfig(workflows=2, seed=4))
    starts = sum(isinstance(e, ToolStart) for e in trace.events)
    ends = sum(isinstance(e, ToolEnd) for e in trace.events)
    before = server.client.get("/agentcache/v1/stats").json()["tool_events"]
    workload = Workload(trace, TokenMaker(vocab_size_of(ensure_model(None, "tiny")), 0.02), 0.0, max_new_tokens=1)
    headers = {"Authorization": server.client.headers["Authorization"]}
    answers, _ = asyncio.run(workload.drive(server.base_url, headers, lifecycle=Lifecycle.PLUGIN))
    after = server.client.get("/agentcache/v1/stats").json()["tool_events"]
    assert len(answers) == len(trace.requests)
    assert (after["tool_start"] - before["tool_start"], after["tool_end"] - before["tool_end"]) == (starts, ends)
    assert after["refused"] == before["refused"] and starts > 0


def test_the_tool_pauses_live_page_is_its_figures():
    """docs/results/tool-pauses-live.md is what benchmarks/tool_pauses_live.py writes from the JSON beside it."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "benchmarks"))
    import tool_pauses_live
    from pages import unstamped

    results = root / "docs" / "results"
    figures = json.loads((results / "tool-pauses-live.json").read_text())
    page, made = unstamped((results / "tool-pauses-live.md").read_text())
    assert tool_pauses_live.markdown(figures) == page
    assert made == {"command": figures["command"], "commit": figures["commit"]}
    for part in ("replay", "bench"):
        assert part in figures, f"the page has its {part} part"
