import hashlib
import io
from collections import Counter, defaultdict
from dataclasses import replace

import pytest

from agentcache.trace import AgentDone, End, Next, Request, Segment, TraceWriter, iter_trace, write_trace
from agentcache.workloads import DYNAMIC_FAMILIES, FAMILIES, GenConfig, chat, generate, mix, phased_chat
from agentcache.workloads.stats import continuation_rate, reuse_shares

CHAT_FAMILIES = (chat.FAMILY, mix.FAMILY)  # a workflow per chat request, not per run
AGENT_FAMILIES = sorted(set(FAMILIES) - set(CHAT_FAMILIES))
APPENDING_FAMILIES = ["code-retry", "fact-verify", "group-chat", "pipeline"]


def roundtrip(trace):
    buf = io.StringIO()
    with TraceWriter(buf, trace.meta) as writer:
        for e in trace.events:
            writer.write(e)
    return list(iter_trace(buf.getvalue().splitlines(), "gen"))


def run_of(workflow):
    """The top-level run a workflow belongs to: a chat request's conversation, else the workflow itself."""
    return workflow.rsplit("-", 1)[0] if workflow.startswith(f"{chat.FAMILY}-") else workflow


def by_workflow(trace):
    out = defaultdict(list)
    for r in trace.requests:
        out[r.workflow].append(r)
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_writes_a_valid_trace_with_call_graph(family, small_traces):
    trace = small_traces[family]
    items = roundtrip(trace)  # the reader's validation accepts every line
    assert len(items) == len(trace.events) + 1
    assert trace.meta.call_graph and trace.meta.extra["generator"]["family"] == family
    requests = trace.requests
    assert len({run_of(r.workflow) for r in requests}) == 30
    # every agent named in the trace is in the call graph
    graph_agents = set(trace.meta.call_graph) | {b for s in trace.meta.call_graph.values() for b in s}
    assert {r.agent for r in requests} <= graph_agents


@pytest.mark.parametrize("family", AGENT_FAMILIES)
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
    "bad",
    [
        dict(workflows=0),
        dict(rate=0),
        dict(loop_prob=1.0),
        dict(unended=2),
        dict(fixed_tokens=0),
        dict(rebuild=-0.1),
        dict(rebuild=1.5),
    ],
)
def test_bad_knobs_are_refused(bad):
    with pytest.raises(ValueError):
        GenConfig(**bad)


def test_dynamic_families_are_known():
    assert set(DYNAMIC_FAMILIES) <= set(FAMILIES) and "pipeline" not in DYNAMIC_FAMILIES
    assert phased_chat.FAMILY in DYNAMIC_FAMILIES and not set(CHAT_FAMILIES) & set(DYNAMIC_FAMILIES)


def test_requests_have_positive_sizes(small_traces):
    for trace in small_traces.values():
        for e in trace.events:
            if isinstance(e, Request):
                assert e.output >= 1 and all(s.tokens >= 1 for s in e.segments)


# ---------------------------------------------------------------- rebuild knob

# sha256 of write_trace output as the generators wrote it before the rebuild knob existed: left at its
# default, the knob must not change a byte. A deliberate change to a generator updates these.
DEFAULT_TRACE_SHA256 = {
    ("code-retry", "small"): "cb8c0c41f84390b03b21636405866e3c120042e7a6a4cbb2726ac07cc66879f1",
    ("code-retry", "knobs"): "69f3ad9a0cdf0e71cf1630a25dd53b842a86b352a124ef62e83aa3afd3ac4cc1",
    ("fact-verify", "small"): "6e66216101cacf93719fa4b2aeb2b9e94dc05c692b717049d5d72a1072184c88",
    ("fact-verify", "knobs"): "e8b60daa696ec6eb420c92f825261ca2818ffb60856080e4b3f17cee9be95cc7",
    ("group-chat", "small"): "6d1fa083430f48510bbdcca799f23d9770b25cb842137b9051c67e80fc268573",
    ("group-chat", "knobs"): "2d00d88985e7b15086363690fd0a3605be1c5aee314a5f1f633eb8031dbe07b8",
    ("pipeline", "small"): "7a73a4d1734696273da9947d8a0e05cfbc03cc84277b523e8f471ef45cbe15c2",
    ("pipeline", "knobs"): "5f36dcd4ac4bd92aa9b514ceb4aca2703467b88f17c145d13ba4e881d59b4062",
}
HASHED_CONFIGS = {
    "small": GenConfig(workflows=12, seed=7),
    "knobs": GenConfig(workflows=20, rate=2.0, loop_prob=0.8, unended=0.1, seed=3),
}


@pytest.mark.parametrize(("family", "config"), sorted(DEFAULT_TRACE_SHA256))
def test_appending_families_write_the_same_bytes_as_before_the_rebuild_knob(family, config, tmp_path):
    path = tmp_path / "trace.jsonl"
    write_trace(path, generate(family, HASHED_CONFIGS[config]))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == DEFAULT_TRACE_SHA256[(family, config)]


@pytest.mark.parametrize("family", APPENDING_FAMILIES)
def test_appending_families_default_to_never_rebuilding(family):
    default = generate(family, GenConfig(workflows=20, seed=4))
    assert generate(family, GenConfig(workflows=20, seed=4, rebuild=0.0)).events == default.events
    assert continuation_rate(default) == pytest.approx(0.346 if family == "group-chat" else 1.0, abs=0.05)


@pytest.mark.parametrize("family", AGENT_FAMILIES)
def test_rebuild_knob_sets_the_continuation_rate(family):
    rates = {p: continuation_rate(generate(family, GenConfig(workflows=60, seed=6, rebuild=p))) for p in (0, 0.5, 1)}
    assert rates[1] == 0.0, "a rebuilt prompt never extends the agent's previous prompt + output"
    assert rates[0] > rates[0.5] > rates[1]


@pytest.mark.parametrize("family", AGENT_FAMILIES)
def test_rebuilding_changes_how_prompts_look_not_what_runs(family):
    appended = generate(family, GenConfig(workflows=20, seed=8, rebuild=0.0)).requests
    rebuilt = generate(family, GenConfig(workflows=20, seed=8, rebuild=1.0)).requests
    shape = lambda reqs: [(r.workflow, r.agent, r.output) for r in reqs]  # noqa: E731
    assert shape(rebuilt) == shape(appended)
    for a, b in zip(appended, rebuilt, strict=True):
        # the same fixed prompt and shared context, then the history re-rendered: the same size plus framing
        assert b.segments[:-1] == a.segments[: len(b.segments) - 1]
        assert b.segments[-1].content_id.startswith("render/")
        assert 0 < b.prompt_tokens - a.prompt_tokens < 100


# ---------------------------------------------------------------- phased chat


def test_phased_chat_reuse_comes_from_fixed_prompts_and_per_run_context():
    trace = generate(phased_chat.FAMILY, GenConfig(workflows=100, seed=1))
    assert continuation_rate(trace) == 0.0
    shares = reuse_shares(trace)
    # the recording: a third of the reusable tokens are fixed prompts, two thirds per-run shared context
    assert 0.27 < shares.fixed_share < 0.4
    assert 0.3 < shares.fresh_share < 0.5
    requests = trace.requests
    tails = Counter(r.segments[-1].content_id for r in requests)
    assert max(tails.values()) == 1, "every prompt ends in a tail no other prompt holds"
    outputs = {r.output_id for r in requests}
    for r in requests:
        task, instructions = r.segments[r.fixed : r.fixed + 2]
        assert task.content_id == f"task/{r.workflow}"
        assert instructions.content_id.startswith(f"phase/{r.workflow}/")
        assert instructions.tokens > task.tokens, "the phase's instructions embed the task"
        assert all(r.workflow in s.content_id for s in r.segments[r.fixed :]), (
            "context after the fixed prompt is per run"
        )
        assert r.output_id not in {s.content_id for s in r.segments}
    carried = {s.content_id for r in requests for s in r.segments[r.fixed + 2 : -1]}
    assert carried and carried <= outputs | {s for s in carried if s.startswith("test-report/")}


def test_phased_chat_roles_follow_the_role_graph_and_phases_loop():
    trace = generate(phased_chat.FAMILY, GenConfig(workflows=60, seed=2))
    graph = trace.meta.call_graph
    assert set(graph) == set(phased_chat.ROLES)
    for requests in by_workflow(trace).values():
        assert requests[0].agent == "cpo" and requests[-1].agent == "cpo"  # demand analysis ... documentation
        for before, after in zip(requests, requests[1:], strict=False):
            assert after.agent in graph[before.agent]
        fixed = defaultdict(set)
        for r in requests:
            fixed[r.agent].add(r.segments[: r.fixed])
        assert all(len(f) == 1 for f in fixed.values()), "a role has one fixed prompt in every phase"

    def phases(loop_prob):
        t = generate(phased_chat.FAMILY, GenConfig(workflows=60, seed=2, loop_prob=loop_prob))
        return Counter(r.segments[r.fixed + 1].content_id.rsplit("/", 1)[1] for r in t.requests)

    assert phases(0.0)["review-modification"] == phases(0.0)["test-modification"] == 0
    assert phases(0.9)["review-modification"] > 0 and phases(0.9)["test-modification"] > 0


# ---------------------------------------------------------------- chat


def test_chat_is_a_workflow_per_request_ended_right_after_it():
    trace = generate(chat.FAMILY, GenConfig(workflows=80, seed=3))
    last_request = {}
    for e in trace.events:
        if isinstance(e, Request):
            assert e.workflow not in last_request, "one request per workflow"
            last_request[e.workflow] = e
        else:
            request = last_request[e.workflow]
            assert request.ts <= e.ts <= request.ts + 1.0 + request.output / GenConfig().decode_tok_s
    assert trace.ended_workflows == set(last_request)


def test_chat_turns_extend_earlier_turns_with_the_answers():
    trace = generate(chat.FAMILY, GenConfig(workflows=200, seed=3))
    conversations = defaultdict(list)
    for r in trace.requests:
        conversations[run_of(r.workflow)].append(r)
    turns = Counter(len(c) for c in conversations.values())
    assert turns[1] > 0 and max(turns) <= chat.MAX_TURNS and sum(turns.values()) == 200
    gaps = []
    for requests in conversations.values():
        for prev, r in zip(requests, requests[1:], strict=False):
            assert r.segments[: len(prev.segments) + 1] == (*prev.segments, Segment(prev.output_id, prev.output))
            assert len(r.segments) == len(prev.segments) + 2  # the answer, then the next user message
            gaps.append(r.ts - prev.ts)
    assert 10 < sum(gaps) / len(gaps) < 60, "users think between turns"
    systems = Counter(r.segments[0] for r in trace.requests if r.segments[1].content_id.endswith("/1"))
    assert len(systems) == len(chat.ASSISTANTS) and len({s.tokens for s in systems}) == len(systems)
    assert all(r.fixed == 1 and r.agent in chat.ASSISTANTS for r in trace.requests)
    spans = sorted((c[0].ts, c[-1].ts) for c in conversations.values())
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:], strict=False)), "they overlap"
    rebuilt = generate(chat.FAMILY, GenConfig(workflows=50, seed=3, rebuild=1.0))
    assert reuse_shares(rebuilt).context_reused == 0, "re-rendered conversations reuse only system prompts"


# ---------------------------------------------------------------- mixed traffic


def test_mix_keeps_every_event_in_time_order_with_distinct_workflows():
    a = generate("code-retry", GenConfig(workflows=20, seed=1))
    b = generate(chat.FAMILY, GenConfig(workflows=20, seed=2))
    mixed = mix.mix(a, b)
    assert len(mixed.events) == len(a.events) + len(b.events)
    untagged = [replace(e, app=None) if isinstance(e, Request) else e for e in mixed.events]
    assert Counter(untagged) == Counter(a.events + b.events)  # nothing renamed: nothing clashes
    assert [e.ts for e in mixed.events] == sorted(e.ts for e in mixed.events)
    assert {r.app for r in mixed.requests} == {"code-retry", "chat"}
    assert mixed.meta.call_graph == {**a.meta.call_graph, **b.meta.call_graph}
    assert len(roundtrip(mixed)) == len(mixed.events) + 1

    twice = mix.mix(a, a)  # every workflow and agent clashes
    workflows = {e.workflow for e in twice.events}
    assert len(workflows) == 2 * len({e.workflow for e in a.events})
    assert {r.agent.split("/")[0] for r in twice.requests} == {"1", "2"}
    assert len(roundtrip(twice)) == len(twice.events) + 1


def test_chat_and_code_retry_family_mixes_both_kinds(small_traces):
    trace = small_traces[mix.FAMILY]
    assert trace.meta.name == mix.FAMILY and trace.meta.extra["generator"]["family"] == mix.FAMILY
    apps = Counter(r.app for r in trace.requests)
    assert set(apps) == {chat.FAMILY, "code-retry"}
    assert len({r.workflow for r in trace.requests if r.app == "code-retry"}) == 15
    assert len({run_of(r.workflow) for r in trace.requests if r.app == chat.FAMILY}) == 15


def test_cli_gen_takes_the_rebuild_knob(tmp_path):
    from agentcache.cli import main
    from agentcache.trace import read_trace

    path = tmp_path / "pc.jsonl"
    assert main(["gen", "phased-chat", "-o", str(path), "--workflows", "5", "--rebuild", "0"]) == 0
    trace = read_trace(path)
    assert trace.meta.extra["generator"]["rebuild"] == 0.0 and continuation_rate(trace) > 0
    assert main(["gen", "chat", "-o", str(path), "--workflows", "5", "--rebuild", "2"]) == 2


# ---------------------------------------------------------------- hints knob: what the framework would know


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_hints_add_the_plan_and_events_and_change_nothing_else(family):
    plain = generate(family, GenConfig(workflows=20, seed=6))
    hinted = generate(family, GenConfig(workflows=20, seed=6, hints=True))
    assert hinted.without(["next", "plan"]).events == plain.events, "what runs is the same"
    assert plain.meta.plan is None and "hints" not in plain.meta.extra["generator"]
    assert roundtrip(hinted)[1:] == hinted.events
    if family in (chat.FAMILY, mix.FAMILY):  # no framework, or two apps: no plan
        assert hinted.meta.plan is None
    else:
        assert hinted.meta.plan is not None and {r.agent for r in hinted.requests} <= hinted.meta.plan.agents
        most = max(len(calls) for calls in by_workflow(hinted).values())
        assert hinted.meta.plan.max_turns is None or most <= hinted.meta.plan.max_turns


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {chat.FAMILY}))
def test_a_next_event_names_the_next_caller_and_comes_once_the_answer_it_follows_is_out(family):
    trace = generate(family, GenConfig(workflows=30, seed=8, hints=True))
    told: dict[str, Next] = {}
    last: dict[str, Request] = {}
    decode = GenConfig().decode_tok_s
    nexts = 0
    for e in trace.events:
        if isinstance(e, Next):
            nexts += 1
            before = last[e.workflow]
            assert e.ts >= round(before.ts + 0.3 + before.output / decode, 3) - 1e-9, "never before the answer"
            told[e.workflow] = e
        elif isinstance(e, Request):
            if e.workflow in told:
                assert e.agent in told.pop(e.workflow).agents, "the told agent calls next"
            last[e.workflow] = e
    assert nexts and not told, "every next is followed by its call"


def test_phased_chat_tells_a_phases_roles_done_where_the_chain_cannot_come_back_to_it():
    trace = generate(phased_chat.FAMILY, GenConfig(workflows=10, seed=2, hints=True))
    last: dict[tuple[str, str], str] = {}  # (run, role) -> the phase instructions of its last call
    done: dict[tuple[str, str], str] = {}
    told = 0
    for e in trace.events:
        if isinstance(e, AgentDone):
            told += 1
            done[(e.workflow, e.agent)] = last[(e.workflow, e.agent)]
        elif isinstance(e, Request):
            pair, instructions = (e.workflow, e.agent), e.segments[e.fixed + 1].content_id
            assert done.pop(pair, None) != instructions, "a context told done is not read again"
            last[pair] = instructions
    # Every run leaves demand analysis, language choice, coding, the review loop and the test loop behind.
    assert told >= 10 * 5
