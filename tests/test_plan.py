"""What an app's framework knows (issue 53): its plan, the agents it decided make a workflow's next call, and the
contexts it knows are done; how the policies hear them."""

from __future__ import annotations

import json

import pytest

from agentcache.policy import WorkflowRegistry, make_policy
from agentcache.policy.lru import LRUPolicy
from agentcache.replay import runner
from agentcache.replay.serving import serve_trace
from agentcache.tags import WorkflowKey
from agentcache.trace import AgentDone, End, Meta, Next, Plan, Request, Segment, Trace, write_trace

W1 = WorkflowKey("", "w1")


@pytest.mark.parametrize("name", ["lru", "lifecycle", "cachescout", "pbkv", "pbkv-paper", "lfu"])
def test_every_policy_hears_the_plan_next_and_agent_done_without_failing(name):
    policy = make_policy(name, registry=WorkflowRegistry())
    policy.on_plan("app", Plan(graph={"a": ("b",)}, order=("a", "b"), max_turns=4), 0.0)
    policy.on_next(W1, ("a",), 1.0)  # a workflow not active: nothing to do
    policy.on_agent_done(W1, "a", 2.0)


class Heard(LRUPolicy):
    """LRU that writes down what the replay told it, in order."""

    def __init__(self, registry=None):
        super().__init__(registry)
        self.heard = []

    def on_request(self, tags, now):
        self.heard.append(("request", tags.workflow, tags.agent, tags.app, now))
        return super().on_request(tags, now)

    def on_plan(self, app, plan, now):
        self.heard.append(("plan", app, plan, now))

    def on_next(self, workflow, agents, now):
        self.heard.append(("next", workflow.id, agents, now))

    def on_agent_done(self, workflow, agent, now):
        self.heard.append(("agent_done", workflow.id, agent, now))


def hinted_trace() -> Trace:
    def request(ts, workflow, agent):
        return Request(
            ts, workflow, agent, (Segment(f"sys/{agent}", 40), Segment(f"task/{workflow}", 8)), 1, 4, app="app-1"
        )

    events = [
        request(0.0, "w1", "planner"),
        Next(1.0, "w1", ("coder",)),
        request(1.5, "w1", "coder"),
        AgentDone(2.0, "w1", "planner"),
        request(2.5, "w2", "planner"),
        End(3.0, "w1"),
        End(4.0, "w2"),
    ]
    return Trace(Meta(name="hinted", plan=Plan(graph={"planner": ("coder",), "coder": ()})), events)


@pytest.fixture
def heard(monkeypatch):
    made = []

    def make(spec, **kwargs):
        made.append(Heard(kwargs.get("registry")))
        return made[-1]

    monkeypatch.setattr(runner, "make_policy", make)
    return made


def test_the_plain_replay_tells_the_plan_first_and_each_hint_at_its_time(heard):
    trace = hinted_trace()
    runner.replay_policy(runner.PreparedTrace(trace), "lru", 10_000)
    (policy,) = heard
    assert [h[0] for h in policy.heard] == ["plan", "request", "next", "request", "agent_done", "request"]
    assert policy.heard[0] == ("plan", "app-1", trace.meta.plan, 0.0)
    assert policy.heard[1][3] == "app-1", "requests carry their app"
    assert policy.heard[2] == ("next", "w1", ("coder",), 1.0) and policy.heard[4] == (
        "agent_done",
        "w1",
        "planner",
        2.0,
    )
    heard.clear()
    runner.replay_policy(runner.PreparedTrace(trace.without(["next", "plan"])), "lru", 10_000)
    assert [h[0] for h in heard[0].heard] == ["request"] * 3


def test_the_timed_replay_tells_the_plan_first_and_each_hint_never_before_its_request_finished(heard):
    trace = hinted_trace()
    serve_trace(runner.PreparedTrace(trace), "lru", 10_000)
    (policy,) = heard
    kinds = [h[0] for h in policy.heard]
    assert kinds[0] == "plan" and kinds.count("next") == 1 and kinds.count("agent_done") == 1
    next_at = next(h[3] for h in policy.heard if h[0] == "next")
    coder_at = next(h[4] for h in policy.heard if h[0] == "request" and h[2] == "coder")
    assert 1.0 <= next_at <= coder_at


def test_the_cli_replays_without_next_and_plan_on_request(tmp_path, capsys):
    from agentcache.cli import main

    path = tmp_path / "hinted.jsonl"
    write_trace(path, hinted_trace())
    argv = ["replay", str(path), "--capacity", "10000", "--policy", "pbkv", "--json"]
    assert main([*argv, "--ignore-events", "next,plan"]) == 0
    (ignored,) = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert ignored["ignored_events"] == ["next", "plan"]
    assert main(argv) == 0
