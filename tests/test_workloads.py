import io
from collections import Counter

import pytest

from agentcache.trace import End, Request, TraceWriter, iter_trace
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES, GenConfig, generate


def roundtrip(trace):
    buf = io.StringIO()
    with TraceWriter(buf, trace.meta) as writer:
        for e in trace.events:
            writer.write(e)
    return list(iter_trace(buf.getvalue().splitlines(), "gen"))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_writes_a_valid_trace_with_call_graph(family, small_traces):
    trace = small_traces[family]
    items = roundtrip(trace)  # the reader's validation accepts every line
    assert len(items) == len(trace.events) + 1
    assert trace.meta.call_graph and trace.meta.extra["generator"]["family"] == family
    requests = trace.requests
    assert len({r.workflow for r in requests}) == 30
    # every agent named in the trace is in the call graph
    graph_agents = set(trace.meta.call_graph) | {b for s in trace.meta.call_graph.values() for b in s}
    assert {r.agent for r in requests} <= graph_agents


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_prompts_are_fixed_prompt_then_history_with_outputs_reused(family, small_traces):
    requests = small_traces[family].requests
    fixed_by_agent = {}
    outputs = {r.output_id for r in requests}
    reused = 0
    for r in requests:
        fixed = r.segments[: r.fixed]
        assert fixed, "every agent has a fixed prompt"
        assert fixed_by_agent.setdefault(r.agent, fixed) == fixed, "an agent always starts with the same fixed prompt"
        assert r.segments[r.fixed].content_id == f"task/{r.workflow}", "the history starts with the task"
        reused += sum(1 for s in r.segments if s.content_id in outputs)
    assert reused > len(requests) / 2, "later prompts carry earlier outputs"


def test_knobs_change_what_they_say():
    base = GenConfig(workflows=40, seed=5)
    slow = generate("code-retry", base)
    fast = generate("code-retry", GenConfig(workflows=40, seed=5, rate=base.rate * 10))
    span = lambda t: max(e.ts for e in t.events)  # noqa: E731
    assert span(fast) < span(slow)
    big = generate("pipeline", GenConfig(workflows=10, fixed_tokens=4000, seed=1))
    small = generate("pipeline", GenConfig(workflows=10, fixed_tokens=400, seed=1))
    assert sum(r.fixed_tokens for r in big.requests) > 5 * sum(r.fixed_tokens for r in small.requests)
    loopy = generate("code-retry", GenConfig(workflows=200, loop_prob=0.9, seed=2))
    straight = generate("code-retry", GenConfig(workflows=200, loop_prob=0.0, seed=2))
    assert len(loopy.requests) > 1.5 * len(straight.requests)
    assert Counter(r.agent for r in straight.requests)["analyzer"] == 0


def test_unended_share_and_seed():
    trace = generate("fact-verify", GenConfig(workflows=50, unended=0.2, seed=9))
    ended = {e.workflow for e in trace.events if isinstance(e, End)}
    assert len(ended) == 40
    again = generate("fact-verify", GenConfig(workflows=50, unended=0.2, seed=9))
    assert again.events == trace.events
    other = generate("fact-verify", GenConfig(workflows=50, unended=0.2, seed=10))
    assert other.events != trace.events


def test_static_pipeline_follows_its_call_graph(small_traces):
    trace = small_traces["pipeline"]
    graph = trace.meta.call_graph
    last = {}
    for r in trace.requests:
        if r.workflow in last:
            assert r.agent in graph[last[r.workflow]]
        last[r.workflow] = r.agent


def test_retry_loop_exit_depends_on_history():
    trace = generate("code-retry", GenConfig(workflows=300, loop_prob=0.9, seed=4))
    attempts = Counter(r.workflow for r in trace.requests if r.agent == "tester")
    assert max(attempts.values()) == 3  # MAX_ROUNDS stops the loop however the tests go


def test_selector_precedes_every_turn(small_traces):
    trace = small_traces["group-chat"]
    by_wf = {}
    for r in trace.requests:
        by_wf.setdefault(r.workflow, []).append(r.agent)
    for agents in by_wf.values():
        assert agents[0::2] == ["selector"] * len(agents[0::2])
        assert "selector" not in agents[1::2]


@pytest.mark.parametrize(
    "bad", [dict(workflows=0), dict(rate=0), dict(loop_prob=1.0), dict(unended=2), dict(fixed_tokens=0)]
)
def test_bad_knobs_are_refused(bad):
    with pytest.raises(ValueError):
        GenConfig(**bad)


def test_dynamic_families_are_known():
    assert set(DYNAMIC_FAMILIES) <= set(FAMILIES) and "pipeline" not in DYNAMIC_FAMILIES


def test_requests_have_positive_sizes(small_traces):
    for trace in small_traces.values():
        for e in trace.events:
            if isinstance(e, Request):
                assert e.output >= 1 and all(s.tokens >= 1 for s in e.segments)
