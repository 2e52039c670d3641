"""What an app's framework knows (issue 53): its plan, the agents it decided make a workflow's next call, and the
contexts it knows are done; how the policies hear them."""

from __future__ import annotations

import json

import pytest
from test_policies import FixedForecast

from agentcache.policy import WorkflowRegistry, make_policy
from agentcache.policy.lru import LRUPolicy
from agentcache.predictor import END
from agentcache.replay import runner
from agentcache.replay.engine import ReplayCache
from agentcache.replay.serving import serve_trace
from agentcache.replay.tokens import TokenCodec
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace import AgentDone, End, Meta, Next, Plan, Request, Segment, ToolStart, Trace, write_trace
from agentcache.workloads import GenConfig, generate

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


# ---------------------------------------------------------------- pbkv uses them

W2 = WorkflowKey("", "w2")
# The coder may call again; a worker calls again more surely. Told that the coder calls next, its path is worth
# more than a worker's; told that its context is done, less than any.
FORECAST = {"coder": [{"coder": 0.5, END: 0.5}], "worker": [{"worker": 0.9, END: 0.1}]}


class Scene:
    """Workflow w1's coder answered; workers of other workflows fill the cache. Each request's path is 110 tokens
    (100 of prompt, 10 of output); the cache holds three."""

    def __init__(self, forecast=FORECAST):
        self.policy = make_policy("pbkv", predictor=FixedForecast(forecast, horizon=1))
        self.cache = ReplayCache(350, self.policy)
        self.codec, self.served = TokenCodec(), 0

    def serve(self, request: Request) -> int:
        enc = self.codec.encode(request, self.served)
        self.served += 1
        tags = runner.request_tags(request, enc)
        self.policy.on_request(tags, request.ts)
        return self.cache.serve(enc, tags, request.ts).hit_tokens

    def coder(self, ts: float, again: bool = False) -> int:
        segments = (Segment("task/w1", 100), *((Segment("answer/w1", 10),) if again else ()))
        return self.serve(Request(ts, "w1", "coder", segments, 0, 10, None if again else "answer/w1"))

    def workers(self, names: str, ts: float) -> None:
        for i, name in enumerate(names.split()):
            self.serve(Request(ts + i, name, "worker", (Segment(f"task/{name}", 100),), 0, 10))


@pytest.mark.parametrize("told", [False, True])
def test_a_next_event_makes_the_told_agents_path_worth_its_certain_call(told):
    scene = Scene()
    scene.coder(0.0)
    if told:
        runner.hear_hint(scene.policy, Next(1.0, "w1", ("coder",)), 1.0)
        assert scene.policy.forecasts.next[W1] == {"coder": 1.0}
    scene.workers("w2 w3 w4", 2.0)  # the third evicts a path: the coder's unless it was told to come next
    assert scene.coder(6.0, again=True) == (109 if told else 0)
    assert scene.policy.forecasts.next[W1] == {"coder": 0.5}, "the call arrived: the forecast is the forecaster's"


def test_agent_done_values_the_pairs_path_as_retired_until_it_calls_again():
    sure = {"coder": [{"coder": 0.95, END: 0.05}], "worker": [{"worker": 0.9, END: 0.1}]}
    scene = Scene(sure)
    scene.coder(0.0)
    node = scene.policy.latest[W1]["coder"].end
    assert scene.policy.priority(node)[0] == 1
    runner.hear_hint(scene.policy, AgentDone(1.0, "w1", "coder"), 1.0)
    assert scene.policy.priority(node)[0] == 0, "keyed as retired"
    scene.policy.on_agent_done(W2, "nobody", 1.5)  # no path of it: nothing to do
    assert scene.policy.hints.done == {W1: {"coder": scene.policy.latest[W1]["coder"].stamp}}
    scene.workers("w2 w3 w4", 2.0)
    assert scene.coder(6.0, again=True) == 0, "its path went first"
    assert scene.policy.hints.done == {}, "calling again, the agent's new path is valued as any"
    scene.policy.on_end(W1, 7.0)


def test_the_plan_is_the_prior_of_an_apps_first_steps_and_its_turn_limit_caps_them():
    policy = make_policy("pbkv")
    policy.on_plan("app-1", Plan(order=("a", "b", "c"), max_turns=3), 0.0)

    def request(workflow, agent, ts, app="app-1"):
        return policy.on_request(Tags(workflow=workflow, agent=agent, app=app), ts)

    request("w1", "a", 1.0)
    assert policy.forecasts.next[W1] == pytest.approx({"b": 1.0}), "nothing learned yet: the plan's order"
    request("w2", "a", 1.5, app=None)  # another app: the forecaster's own (it knows nothing of b)
    assert "b" not in policy.forecasts.next.get(W2, {})
    request("w1", "b", 2.0)
    request("w1", "c", 3.0)
    assert policy.forecasts.values[W1] == {}, "the third call is the last the turn limit allows"
    assert policy.forecast_stats()["plan"]["known_agent"] >= 3
    policy.on_end(W1, 4.0)
    assert policy.hints.priors["app-1"].seen == {"a": 1, "b": 1} and W1 not in policy.hints.prior_of
    request("w3", "a", 5.0)
    learned = policy.forecasts.next[WorkflowKey("", "w3")]
    assert 0.5 <= learned["b"] < 1.0, "one step out of a seen: the plan weighs as much as what was learned"


def test_a_plan_that_comes_just_after_its_apps_first_request_forecasts_that_workflows_next_steps():
    """The SDK sends the plan on its background channel before the app's first request: it may reach the server
    just after it. The workflow already running is forecast from the plan from its next step on."""
    policy = make_policy("pbkv")
    policy.on_request(Tags(workflow="w1", agent="a", app="app-1"), 1.0)
    policy.on_plan("app-1", Plan(order=("a", "b", "c")), 1.1)
    policy.on_request(Tags(workflow="w1", agent="b", app="app-1"), 2.0)
    assert policy.forecasts.next[W1] == pytest.approx({"c": 1.0}), "nothing learned of b: the plan's order"
    policy.on_end(W1, 3.0)
    assert W1 not in policy.hints.app_of


def test_a_turn_limit_that_an_apps_workflow_outruns_caps_no_forecast_from_then_on():
    """An AutoGen turn or a LangGraph superstep may hold several LLM calls: a limit of 2 turns, and a workflow makes
    three calls. From then on the limit says nothing of how many calls are left, for any workflow of the app."""
    policy = make_policy("pbkv")
    policy.on_plan("app-1", Plan(order=("a", "b"), max_turns=2), 0.0)
    for i, agent in enumerate("aba"):
        policy.on_request(Tags(workflow="w1", agent=agent, app="app-1"), 1.0 + i)
    policy.on_request(Tags(workflow="w2", agent="a", app="app-1"), 5.0)
    policy.on_request(Tags(workflow="w2", agent="b", app="app-1"), 6.0)
    assert policy.forecasts.values[WorkflowKey("", "w2")], "at the turn limit, still forecast: a call may follow"


def test_pbkv_replays_a_trace_without_its_hints_as_the_same_trace_generated_without_them():
    plain = generate("phased-chat", GenConfig(workflows=12, seed=3))
    hinted = generate("phased-chat", GenConfig(workflows=12, seed=3, hints=True))
    capacity = 20_000
    without = runner.replay_policy(runner.PreparedTrace(hinted.without(["next", "plan"])), "pbkv", capacity)
    assert without.hit_tokens == runner.replay_policy(runner.PreparedTrace(plain), "pbkv", capacity).hit_tokens
    assert runner.replay_policy(runner.PreparedTrace(hinted), "pbkv", capacity).hit_tokens != without.hit_tokens


def test_a_pause_says_more_than_a_next_event_for_the_agent_waiting_on_its_tool():
    """The framework tells that the coder calls next, then the coder's tool starts: the pause values the coder's
    path as it would without the next event (its certain call, not the told forecast's more)."""

    def paused_values(told: bool) -> dict:
        scene = Scene()
        scene.coder(0.0)
        if told:
            runner.hear_hint(scene.policy, Next(1.0, "w1", ("coder",)), 1.0)
        runner.hear_hint(scene.policy, ToolStart(1.0, "w1", "coder", "run_tests"), 1.0)
        return dict(scene.policy.forecasts.values[W1])

    assert paused_values(told=True) == paused_values(told=False) == {"coder": 1.0}


def test_pbkv_without_its_plan_ingredient_is_pbkv_with_the_hints_ignored():
    hinted = generate("phased-chat", GenConfig(workflows=12, seed=3, hints=True))
    capacity = 20_000
    ignored = runner.replay_policy(runner.PreparedTrace(hinted.without(["next", "plan"])), "pbkv", capacity)
    deaf = runner.replay_policy(runner.PreparedTrace(hinted), "pbkv/-plan", capacity)
    assert deaf.hit_tokens == ignored.hit_tokens
