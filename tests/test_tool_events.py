"""Tool events (tool_start, tool_end): the tool-use family writes them, both replays feed them to the policy at
their times, a policy that ignores them replays as without them, and --ignore-events leaves them out."""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict

import pytest

from agentcache.policy.lru import LRUPolicy
from agentcache.replay import runner
from agentcache.replay.runner import PreparedTrace, replay
from agentcache.replay.serving import serve_trace
from agentcache.tags import WorkflowKey
from agentcache.trace import End, Request, ToolEnd, ToolEvent, ToolStart, read_trace, write_trace
from agentcache.workloads import GenConfig, generate, tool_use

SMALL = GenConfig(workflows=24, rate=1.0, seed=5)


@pytest.fixture(scope="module")
def small():
    return generate(tool_use.FAMILY, SMALL)


def capacity_of(trace, share=0.25):
    """A cache that holds `share` of what the trace's prompts and outputs need: contended."""
    return int(share * sum(r.prompt_tokens + r.output for r in trace.requests) / 4)


# ---------------------------------------------------------------- the family


def test_tool_events_pair_up_in_time_order_between_the_agents_calls(small):
    events = small.events
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    open_tool: dict[str, ToolStart] = {}
    last_request: dict[str, Request] = {}
    starts = 0
    for e in events:
        if isinstance(e, ToolStart):
            assert e.workflow not in open_tool, "one tool at a time per workflow"
            assert last_request[e.workflow].agent == e.agent, "the agent whose answer asked for the tool"
            open_tool[e.workflow] = e
            starts += 1
        elif isinstance(e, ToolEnd):
            start = open_tool.pop(e.workflow)
            assert (start.agent, start.tool) == (e.agent, e.tool) and e.ts >= start.ts
        elif isinstance(e, Request):
            assert e.workflow not in open_tool, "no call while the workflow waits on its tool"
            last_request[e.workflow] = e
        else:
            assert isinstance(e, End) and e.workflow not in open_tool
    assert not open_tool and starts >= len(last_request), "every task calls at least one tool"
    worker_tools = {t.name for tools in tool_use.TOOLS.values() for t in tools}
    assert {e.tool for e in events if isinstance(e, ToolEvent)} <= worker_tools


def test_the_call_after_a_tool_resends_prompt_answer_and_the_tools_result(small):
    previous: dict[str, Request] = {}
    after_tool: set[str] = set()
    checked = 0
    for e in small.events:
        if isinstance(e, ToolEnd):
            after_tool.add(e.workflow)
        elif isinstance(e, Request):
            prev = previous.get(e.workflow)
            if e.workflow in after_tool:
                n = len(prev.segments)
                assert e.agent == prev.agent and e.segments[:n] == prev.segments
                assert e.segments[n].content_id == prev.output_id, "its answer, re-sent"
                assert e.segments[n + 1].content_id.startswith(f"tool/{e.workflow}/"), "then the tool's result"
                checked += 1
            after_tool.discard(e.workflow)
            previous[e.workflow] = e
    assert checked > 24


def test_pause_durations_are_log_normal_per_tool_as_documented():
    trace = generate(tool_use.FAMILY, GenConfig(workflows=500, rate=2.0, seed=11))
    started: dict[str, ToolStart] = {}
    durations: dict[str, list[float]] = defaultdict(list)
    for e in trace.events:
        if isinstance(e, ToolStart):
            started[e.workflow] = e
        elif isinstance(e, ToolEnd):
            durations[e.tool].append(e.ts - started.pop(e.workflow).ts)
    tools = {t.name: t for ts in tool_use.TOOLS.values() for t in ts}
    assert set(durations) == set(tools)
    for name, values in durations.items():
        tool = tools[name]
        assert len(values) > 200
        logs = [math.log(max(v, 1e-3)) for v in values]
        # median and shape within sampling error of the documented parameters
        assert statistics.median(values) == pytest.approx(tool.median_s, rel=0.25), name
        assert statistics.stdev(logs) == pytest.approx(tool.shape, rel=0.2), name
    # heavy tails: most pauses take seconds, some minutes
    every = [v for values in durations.values() for v in values]
    assert statistics.median(every) < 10 and sum(v > 60 for v in every) >= 0.02 * len(every)
    assert tool_use.duration_quantile(tools["run_tests"], 0.5) == pytest.approx(20.0)


def test_held_out_variant_has_other_tools_and_agents_and_the_seed_decides():
    held = generate(tool_use.FAMILY, GenConfig(workflows=30, seed=5, held_out=True))
    held_tools = {e.tool for e in held.events if isinstance(e, ToolEvent)}
    default_tools = {t.name for ts in tool_use.TOOLS.values() for t in ts}
    assert held_tools and not held_tools & default_tools
    assert {r.agent for r in held.requests} == {*tool_use.HELD_OUT_TOOLS, tool_use.REVIEWER}
    assert held.meta.extra["generator"]["held_out"] is True
    assert "held_out" not in generate(tool_use.FAMILY, SMALL).meta.extra["generator"]
    assert generate(tool_use.FAMILY, SMALL).events == generate(tool_use.FAMILY, SMALL).events
    assert generate(tool_use.FAMILY, GenConfig(workflows=24, rate=1.0, seed=6)).events != held.events
    with pytest.raises(ValueError, match="code-retry has no held-out variant"):
        generate("code-retry", GenConfig(workflows=3, held_out=True))


def test_gen_writes_the_family_and_its_held_out_variant(tmp_path, capsys):
    from agentcache.cli import main

    path = tmp_path / "tools.jsonl"
    assert main(["gen", "tool-use", "-o", str(path), "--workflows", "5", "--held-out", "--seed", "2"]) == 0
    trace = read_trace(path)
    assert trace.events == generate(tool_use.FAMILY, GenConfig(workflows=5, seed=2, held_out=True)).events
    assert main(["gen", "pipeline", "-o", str(tmp_path / "p.jsonl"), "--held-out"]) == 2
    assert "pipeline has no held-out variant" in capsys.readouterr().err


def test_a_mix_keeps_the_tool_events_with_their_workflows_renamed():
    from agentcache.workloads import chat
    from agentcache.workloads.mix import mix

    tools = generate(tool_use.FAMILY, GenConfig(workflows=4, seed=1))
    mixed = mix(generate(chat.FAMILY, GenConfig(workflows=4, seed=1)), tools)
    kept = [e for e in mixed.events if isinstance(e, ToolEvent)]
    assert len(kept) == sum(isinstance(e, ToolEvent) for e in tools.events)
    workflows = {r.workflow for r in mixed.requests}
    assert all(e.workflow in workflows for e in kept)


# ---------------------------------------------------------------- the replays


def test_policies_that_do_not_use_tool_events_replay_exactly_as_without_them(small):
    bare = small.without(["tool"])
    assert len(bare.events) < len(small.events) and bare.requests == small.requests
    capacity = capacity_of(small)
    policies = ["lru", "lfu", "pbkv/-tools"]  # pbkv itself uses them (tests/test_tool_pauses.py)
    with_events = replay(small, policies, [capacity])
    without = replay(bare, policies, [capacity])
    assert [r.to_json() | {"replay_wall_s": 0} for r in with_events] == [
        r.to_json() | {"replay_wall_s": 0} for r in without
    ]
    assert 0 < with_events[0].hit_rate < 1
    # the timed replay too: every request timed and served as without the events
    timed = [serve_trace(PreparedTrace(t), "lru", capacity, workers=1) for t in (small, bare)]
    assert [vars(s) for s in timed[0].served] == [vars(s) for s in timed[1].served]


class HearingPolicy(LRUPolicy):
    """LRU that writes down the tool events it hears."""

    heard: list[tuple[str, WorkflowKey, str, str, float]]

    def on_tool_start(self, workflow, agent, tool, now):
        self.heard.append(("tool_start", workflow, agent, tool, now))

    def on_tool_end(self, workflow, agent, tool, now):
        self.heard.append(("tool_end", workflow, agent, tool, now))


@pytest.fixture
def hearing(monkeypatch):
    policies: list[HearingPolicy] = []

    def make(spec, registry=None, **_):
        policy = HearingPolicy(registry)
        policy.heard = []
        policies.append(policy)
        return policy

    monkeypatch.setattr(runner, "make_policy", make)
    return policies


def test_the_replay_feeds_tool_events_to_the_policy_at_their_times(small, hearing):
    replay(small, ["lru"], [capacity_of(small)])
    (policy,) = hearing
    expected = [
        (e.TYPE, WorkflowKey("", e.workflow), e.agent, e.tool, e.ts) for e in small.events if isinstance(e, ToolEvent)
    ]
    assert policy.heard == expected and expected
    replay(small.without(["tool"]), ["lru"], [capacity_of(small)])
    assert hearing[1].heard == []


def test_the_timed_replay_feeds_tool_events_between_the_calls_they_separate(small, hearing):
    result = serve_trace(PreparedTrace(small), "lru", capacity_of(small), workers=1)
    (policy,) = hearing
    expected: dict[str, list[ToolEvent]] = defaultdict(list)
    for e in small.events:
        if isinstance(e, ToolEvent):
            expected[e.workflow].append(e)
    heard: dict[str, list[tuple[str, str, str, float]]] = defaultdict(list)
    for kind, workflow, agent, tool, at in policy.heard:
        heard[workflow.id].append((kind, agent, tool, at))
    calls = defaultdict(list)
    for s in result.served:
        calls[s.workflow].append(s)
    assert set(heard) == set(expected)
    for workflow, events in expected.items():
        got = heard[workflow]
        assert [(k, a, t) for k, a, t, _ in got] == [(e.TYPE, e.agent, e.tool) for e in events]
        assert all(at >= e.ts for (*_, at), e in zip(got, events, strict=True)), "never before its trace time"
        for (_, _, _, start), (_, _, _, end) in zip(got[::2], got[1::2], strict=True):
            before = [s for s in calls[workflow] if s.finished <= start]
            after = [s for s in calls[workflow] if s.arrival >= end]
            assert before and after and len(before) + len(after) == len(calls[workflow]), "a pause between calls"


def test_cli_replay_ignores_event_groups_on_request_and_says_what_it_skipped(small, tmp_path, capsys):
    from agentcache.cli import main

    path = tmp_path / "tools.jsonl"
    write_trace(path, small)
    with path.open("a") as fh:
        fh.write(json.dumps({"type": "handoff", "ts": 1e6, "workflow": "x", "to": ["a"]}) + "\n")
    argv = ["replay", str(path), "--capacity", str(capacity_of(small)), "--policy", "lru", "--json"]
    assert main([*argv, "--ignore-events", "tool"]) == 0
    captured = capsys.readouterr()
    (ignored,) = json.loads(captured.out.strip().splitlines()[-1])
    assert ignored["ignored_events"] == ["tool"]
    assert "left out events of types this agentcache does not know: 'handoff' x1" in captured.err
    assert main(argv) == 0
    (kept,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert kept["ignored_events"] == [] and kept["hit_rate"] == ignored["hit_rate"]
    assert main([*argv, "--ignore-events", "tool,hologram"]) == 2
    assert "--ignore-events: unknown group 'hologram'; choose from tool, next, plan" in capsys.readouterr().err
