"""Tool pauses (issue 52): what a policy keeps of an agent waiting on a tool, for how long, and the hung-tool
cut-off, through SGLang's real cache in the replay engine where the cache's decision is the point."""

from __future__ import annotations

import pytest
from test_policies import FixedForecast

from agentcache.policy import WorkflowRegistry, make_policy
from agentcache.policy.pauses import (
    CUTOFF_CEILING_S,
    CUTOFF_FLOOR_S,
    CUTOFF_P90_MULTIPLE,
    MAX_PAUSES_PER_WORKFLOW,
    MAX_TOOL_MODELS,
    MIN_DURATIONS,
    Pauses,
)
from agentcache.predictor import END
from agentcache.replay.engine import ReplayCache
from agentcache.replay.runner import PreparedTrace, hear_hint, replay_policy
from agentcache.replay.tokens import TokenCodec
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace import Request, Segment, ToolEnd, ToolStart
from agentcache.workloads import generate
from agentcache.workloads.common import GenConfig

W1 = WorkflowKey("", "w1")
# The coder may call itself again; a worker calls itself again more surely. Without its pause the coder's path
# is worth less than a worker's (0.5 against 0.9); waiting on a tool, its next call is the coder's for certain.
FORECAST = {"coder": [{"coder": 0.5, END: 0.5}], "worker": [{"worker": 0.9, END: 0.1}]}


def registry_with(*workflows: WorkflowKey) -> WorkflowRegistry:
    registry = WorkflowRegistry()
    for workflow in workflows:
        registry.observe(workflow, "coder", 0.0)
        registry.release(workflow, 0.0)
    return registry


def test_the_cut_off_is_a_multiple_of_the_learned_p90_within_the_floor_and_the_ceiling():
    pauses = Pauses(registry_with(W1))
    assert pauses.cutoff("coder", "run_tests") == CUTOFF_FLOOR_S  # never seen: the floor
    for i in range(MIN_DURATIONS * 10):
        pauses.learn("coder", "run_tests", 20.0 + i % 10)  # p90 29 s
    assert pauses.cutoff("coder", "run_tests") == pytest.approx(CUTOFF_P90_MULTIPLE * 29.0)
    # A tool the coder never called is taken to be like every tool it did; a slow one stops at the ceiling.
    assert pauses.cutoff("coder", "shell") == pytest.approx(CUTOFF_P90_MULTIPLE * 29.0)
    for _ in range(MIN_DURATIONS):
        pauses.learn("coder", "deploy", 3_600.0)
    assert pauses.cutoff("coder", "deploy") == CUTOFF_CEILING_S
    for _ in range(MIN_DURATIONS):
        pauses.learn("coder", "read_file", 0.5)
    assert pauses.cutoff("coder", "read_file") == CUTOFF_FLOOR_S


def test_a_pause_ends_by_its_tool_end_or_by_the_agents_next_call_and_teaches_its_duration():
    registry = registry_with(W1)
    pauses = Pauses(registry)
    assert not pauses.start(WorkflowKey("", "gone"), "coder", "shell", 1.0)  # not active: nothing kept
    assert pauses.start(W1, "coder", "shell", 1.0)
    assert pauses.counts() == {"open": 1, "cut_off": 0}
    assert pauses.waiting(W1) == ["coder"] and pauses.due(W1, 2.0) == 0.0  # nothing learned: due at once
    assert pauses.end(W1, "coder", "shell", 4.0)
    assert pauses.durations["coder", "shell"].count == 1
    assert pauses.waiting(W1) == ["coder"] and pauses.due(W1, 5.0) == 1.0  # back: its call is due, 1 s late
    assert pauses.request(W1, "coder", 5.1) and not pauses.waiting(W1)
    pauses.start(W1, "coder", "shell", 6.0)  # a client that never sends tool_end: its next call ends the pause
    assert pauses.request(W1, "coder", 9.0)
    assert pauses.durations["coder", "shell"].count == 2 and not pauses.open and pauses.holding == 0
    for i in range(MAX_PAUSES_PER_WORKFLOW + 5):
        pauses.start(W1, f"agent{i}", "shell", 10.0)
    assert len(pauses.open[W1]) == MAX_PAUSES_PER_WORKFLOW == pauses.holding
    pauses.drop(W1)
    assert pauses.holding == 0 and not pauses.open
    for i in range(MAX_TOOL_MODELS + 10):
        pauses.learn("coder", f"tool{i}", 1.0)
    assert len(pauses.durations) == MAX_TOOL_MODELS


def test_a_paused_workflow_is_due_by_its_tools_residual_duration():
    """pbkv weighs a paused workflow by the tool's learned duration left given the time waited, not by its
    agent's gaps: just started on a tool that takes 10 s it is due in about 10 s, then sooner as time passes."""
    policy = make_policy("pbkv")
    for i in range(20):  # gaps of 2 s between requests; the coder's tool calls take 10 s
        workflow = WorkflowKey("", f"w{i}")
        for step in range(2):
            tags = Tags(workflow=workflow.id, agent="coder")
            policy.on_request(tags, i * 30.0 + 2 * step)
            policy.on_release(tags, i * 30.0 + 2 * step)
        policy.on_tool_start(workflow, "coder", "run_tests", i * 30.0 + 3)
        policy.on_tool_end(workflow, "coder", "run_tests", i * 30.0 + 13)
    tags = Tags(workflow="paused", agent="coder")
    policy.on_request(tags, 1_000.0)
    policy.on_release(tags, 1_000.0)
    state = policy.registry.get(WorkflowKey("", "paused"))
    policy.on_tool_start(state.id, "coder", "run_tests", 1_001.0)
    step_gap = policy.timing.gaps.mean
    policy.timing.now = 1_002.0
    assert policy.timing.weight(state) == pytest.approx(0.8 ** (9.0 / step_gap))
    policy.timing.now = 1_010.0
    assert policy.timing.weight(state) == pytest.approx(0.8 ** (1.0 / step_gap))


class Scene:
    """Workflow w1's coder answers with a tool call; workers of other workflows fill the cache while it waits.
    Each request's path is 110 tokens (100 of prompt, 10 of output); the cache holds three."""

    def __init__(self, spec: str):
        self.policy = make_policy(spec, predictor=FixedForecast(FORECAST, horizon=1))
        self.cache = ReplayCache(350, self.policy)
        self.codec, self.served = TokenCodec(), 0

    def serve(self, request: Request) -> int:
        enc = self.codec.encode(request, self.served)
        self.served += 1
        tags = Tags(workflow=request.workflow, agent=request.agent, fixed_tokens=enc.fixed_len)
        self.policy.on_request(tags, request.ts)
        return self.cache.serve(enc, tags, request.ts).hit_tokens

    def coder_calls_a_tool(self) -> None:
        self.serve(Request(0.0, "w1", "coder", (Segment("task/w1", 100),), 0, 10, "answer/w1"))
        hear_hint(self.policy, ToolStart(1.0, "w1", "coder", "run_tests"), 1.0)

    def workers(self, names: str, ts: float) -> None:
        for i, name in enumerate(names.split()):
            self.serve(Request(ts + i, name, "worker", (Segment(f"task/{name}", 100),), 0, 10))

    def coder_returns(self, ts: float) -> int:
        """The coder's next call re-sends its prompt and answer with the tool's result: the tokens it found cached."""
        segments = (Segment("task/w1", 100), Segment("answer/w1", 10), Segment("result/w1", 30))
        return self.serve(Request(ts, "w1", "coder", segments, 0, 10))


@pytest.mark.parametrize("spec", ["pbkv", "pbkv/-tools"])
def test_a_paused_path_is_kept_against_other_demand_until_its_agent_returns(spec):
    scene = Scene(spec)
    scene.coder_calls_a_tool()
    scene.workers("w2 w3 w4", 2.0)  # the third evicts a path: a worker's while the coder waits
    hear_hint(scene.policy, ToolEnd(15.0, "w1", "coder", "run_tests"), 15.0)
    hit = scene.coder_returns(15.2)
    assert hit == (109 if spec == "pbkv" else 0)  # all but the output's last token (never fed back)


def test_a_pause_whose_end_never_comes_stops_protecting_its_path_and_the_lease_then_runs_out():
    """A hung tool must not pin the cache: past its cut-off (the floor, for a tool never seen) the pause protects
    nothing, and pbkv evicts the path as it would with no pause. Its lease counts the pause as activity up to
    the cut-off, then runs out as usual."""

    def pressed(spec: str, *, past_cut_off: bool) -> tuple[Scene, int]:
        scene = Scene(spec)
        scene.coder_calls_a_tool()  # at 0 s, waiting from 1 s; its end never comes
        scene.workers("w2 w3", 2.0)
        scene.workers("w4", CUTOFF_FLOOR_S - 10.0)  # within the cut-off: a worker's path goes
        if past_cut_off:
            assert scene.policy.pause_counts() == {"open": 1, "cut_off": 0}
            scene.workers("w5", CUTOFF_FLOOR_S + 2.0)  # past it: the coder's, as with no pause
            assert scene.policy.pause_counts() == {"open": 0, "cut_off": 1}
        return scene, scene.coder_returns(CUTOFF_FLOOR_S + 5.0 if past_cut_off else CUTOFF_FLOOR_S - 5.0)

    assert pressed("pbkv", past_cut_off=False)[1] == 109
    assert pressed("pbkv/-tools", past_cut_off=False)[1] == 0
    assert pressed("pbkv", past_cut_off=True)[1] == 0

    # The lease (300 s) counts from the pause's cut-off at 1 s + the floor; with no pause heard, from the
    # coder's release at 0 s.
    hung = Scene("pbkv")
    hung.coder_calls_a_tool()
    without = Scene("pbkv/-tools")
    without.coder_calls_a_tool()
    assert without.policy.pause_counts() == {"open": 0, "cut_off": 0}
    retired_at = 1.0 + CUTOFF_FLOOR_S + hung.policy.registry.lease_s
    hung.policy.expire(retired_at - 1.0)
    without.policy.expire(retired_at - 1.0)
    assert hung.policy.registry.is_active(W1) and not without.policy.registry.is_active(W1)
    hung.policy.expire(retired_at + 1.0)
    assert not hung.policy.registry.is_active(W1)
    assert hung.policy.pause_counts() == {"open": 0, "cut_off": 1} and not hung.policy.pauses.open


def test_a_paused_workflows_lease_is_held_up_to_the_cut_off_never_longer():
    policy = make_policy("lru", registry=WorkflowRegistry(lease_s=30.0))  # every policy hears pauses for its lease
    tags = Tags(workflow="w1", agent="coder")
    policy.on_request(tags, 0.0)
    policy.on_release(tags, 0.0)
    policy.on_tool_start(W1, "coder", "deploy", 10.0)  # cut off at 10 + the floor (60 s)
    policy.expire(69.0)
    assert policy.registry.is_active(W1)  # within the cut-off, past a lease from its last activity
    policy.expire(99.0)
    assert policy.registry.is_active(W1)  # a lease past the cut-off, not yet
    policy.expire(100.5)
    assert not policy.registry.is_active(W1)
    assert policy.pause_counts() == {"open": 0, "cut_off": 1}
    assert not policy.pauses.open  # dropped with its workflow


def test_pbkv_without_tools_is_pbkv_with_the_tool_events_ignored():
    """`pbkv/-tools` is "pbkv without tool events": on a trace with them, the same figures as pbkv on the trace
    with them left out (`agentcache replay --ignore-events tool`)."""
    trace = generate("tool-use", GenConfig(workflows=40, rate=1.0, seed=3))
    with_events, ignored = PreparedTrace(trace), PreparedTrace(trace.without(["tool"]))
    mean = sum(e.prompt_len for e in with_events.encoded) / len(with_events.encoded)
    capacity = int(4 * mean)
    off = replay_policy(with_events, "pbkv/-tools", capacity)
    plain = replay_policy(ignored, "pbkv", capacity)
    assert (off.hit_tokens, off.evicted_tokens) == (plain.hit_tokens, plain.evicted_tokens)
    heard = make_policy("pbkv")
    assert heard.hears_tools and not make_policy("pbkv/-tools").hears_tools


def test_pauses_stay_bounded_however_many_workflows_pause_and_never_return():
    policy = make_policy("pbkv")
    for i in range(6_000):
        workflow = WorkflowKey("", f"w{i}")
        tags = Tags(workflow=workflow.id, agent=f"agent{i % 50}")
        policy.on_request(tags, float(i))
        policy.on_release(tags, float(i))
        policy.on_tool_start(workflow, tags.identity, f"tool{i}", i + 0.25)  # a new tool each time
        if i % 4 == 0:
            policy.on_tool_end(workflow, tags.identity, f"tool{i}", i + 0.5)
        elif i % 4 == 1:
            policy.on_end(workflow, i + 0.75)
    pauses = policy.pauses
    assert len(pauses.durations) == MAX_TOOL_MODELS
    assert set(pauses.open) | set(pauses.returned) <= set(policy.registry.by_id)
    assert len(pauses._deadlines) <= 2 * pauses.holding + 1024 + 1
    assert pauses.counts()["cut_off"] > 0  # the unended ones' pauses were cut off within their lease
