"""The SDK's app identity, plan, next and agent_done events against a small local server (the one the tool-event
tests use): the app on every request's tags, the plan once per app and credentials before the app's first
request, decisions sent at once, invalid ones never sent, and the recorder writing them. The real server and
frameworks: tests/test_plan_events_e2e.py."""

from __future__ import annotations

import openai
import pytest
import test_sdk_tool_events
from test_sdk_tool_events import SYSTEM, chat

import agentcache_sdk as ac
from agentcache.trace import AgentDone, Next, read_trace
from agentcache_sdk import _plan

GRAPH = {"planner": ["coder"], "coder": ["tester"], "tester": ["coder"]}

fake = test_sdk_tool_events.fake  # the small local server, as a fixture here too


@pytest.fixture(autouse=True)
def no_plans():
    _plan.forget_plans()
    yield
    _plan.forget_plans()


def tags_sent(fake) -> list[dict]:
    return [body["custom_params"]["agentcache"] for path, body, _ in fake.received if path.endswith("/completions")]


def solve_app(client):
    def solve():
        chat(client, [SYSTEM])

    return solve


def test_every_request_names_its_app_the_decorated_functions_qualified_name_unless_the_app_gives_one(fake):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    solve = solve_app(client)
    ac.workflow(solve)()
    ac.workflow(name="code-assistant")(solve)()
    ac.workflow(app="my-app", name="code-assistant")(solve)()
    with ac.workflow():
        chat(client, [SYSTEM])
    apps = [tags.get("app") for tags in tags_sent(fake)]
    assert apps == [f"{__name__}.solve_app.<locals>.solve", "code-assistant", "my-app", None]
    with pytest.raises(ValueError, match="'app' contains non-printable"):
        ac.workflow(app="a\nb")


def test_the_plan_goes_once_per_app_and_credentials_before_the_apps_first_request(fake):
    @ac.workflow(app="coding")
    def solve(key: str):
        assert ac.plan(graph=GRAPH, max_turns=12)  # as an integration does when the framework starts
        client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key=key)
        chat(client, [SYSTEM])
        chat(client, [SYSTEM])

    solve("sk-a")
    solve("sk-a")
    solve("sk-b")  # another tenant's key: its own copy
    assert ac.flush(5)
    plans = [(b["events"], h["authorization"]) for p, b, h in fake.received if p == "/agentcache/v1/events"]
    event = {"type": "plan", "app": "coding", "plan": {"graph": GRAPH, "max_turns": 12}}
    assert plans == [([event], "Bearer sk-a"), ([event], "Bearer sk-b")]
    # A changed plan goes again.
    ac.workflow(app="coding")(lambda: (ac.plan(order=["planner", "coder"]), solve_app_request(fake, "sk-a")))()
    assert ac.flush(5)
    assert fake.events()[-1] == {"type": "plan", "app": "coding", "plan": {"order": ["planner", "coder"]}}


def solve_app_request(fake, key: str) -> None:
    chat(openai.OpenAI(base_url=f"{fake.url}/v1", api_key=key), [SYSTEM])


def test_next_and_agent_done_go_at_once_inside_a_workflow_the_server_knows_and_never_outside(fake):
    assert not ac.next_agents("coder") and not ac.agent_done("coder")  # outside a workflow
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    with ac.workflow(app="a") as wf:
        assert not ac.next_agents("planner")  # no request yet: the server does not know the workflow
        with ac.agent_name("planner"):
            chat(client, [SYSTEM])
        assert ac.next_agents("coder") and ac.next_agents(["coder", "tester"])
        assert ac.agent_done()  # the workflow's latest agent
        assert not ac.next_agents([f"a{i}" for i in range(17)]) and not ac.next_agents([])
        assert ac.stats()["invalid_events"] == 2
    assert ac.flush(5)
    assert fake.events() == [
        {"type": "next", "workflow": wf.id, "agents": ["coder"]},
        {"type": "next", "workflow": wf.id, "agents": ["coder", "tester"]},
        {"type": "agent_done", "workflow": wf.id, "agent": "planner"},
    ]
    ac.configure(plan_events=False)
    try:
        with ac.workflow(app="a"):
            chat(client, [SYSTEM])
            assert ac.next_agents("coder")  # recorded, not sent
        assert ac.flush(5) and len(fake.events()) == 3
    finally:
        ac.configure(plan_events=True)


def test_the_recorder_writes_the_plan_in_the_meta_line_and_the_decisions_as_events(fake, tmp_path):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    path = tmp_path / "app.jsonl"
    with ac.record(path):
        with ac.workflow(app="coding") as wf:
            ac.plan(graph=GRAPH, order=["planner", "coder", "tester"])
            with ac.agent_name("planner"):
                chat(client, [SYSTEM])
            ac.next_agents("coder")
            ac.agent_done("planner")
    trace = read_trace(path)
    assert trace.meta.plan is not None and trace.meta.plan.order == ("planner", "coder", "tester")
    assert trace.requests[0].app == "coding"
    assert [type(e) for e in trace.events][1:3] == [Next, AgentDone]
    assert trace.events[1].agents == ("coder",) and trace.events[1].workflow == wf.id


def test_a_recording_begun_after_the_plan_was_first_given_takes_it_from_the_apps_next_run(fake, tmp_path):
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")

    @ac.workflow(app="coding")
    def run():
        ac.plan(graph=GRAPH)  # as an integration does at each run's start
        chat(client, [SYSTEM])

    run()
    with ac.record(tmp_path / "later.jsonl"):
        run()
        run()
    assert read_trace(tmp_path / "later.jsonl").meta.plan.graph == {a: tuple(s) for a, s in GRAPH.items()}
