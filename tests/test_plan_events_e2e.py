"""The frameworks' plans and decisions reach the live server (issue 53): apps of each framework it has not seen
(a LangGraph graph with a conditional edge and a tool node, an AutoGen RoundRobinGroupChat with a turn limit, a
sequential CrewAI crew) send their plan and decisions, and each app's requests are forecast from its plan from its
first workflow (`forecasters` in the statistics); one tenant's plan never reaches another's forecasts. The
examples' events are checked in tests/test_examples.py, the exact events in tests/test_integrations_plan.py."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from conftest import API_KEY, TENANT_KEYS
from test_integrations_plan import AUTOGEN_TEAMS, CREWAI_CREW, LANGGRAPH_GRAPH, run_app

pytestmark = pytest.mark.server

COUNTS = ("plan", "next", "agent_done")


def stats(server, key: str = API_KEY) -> dict:
    r = server.client.get("/agentcache/v1/stats", headers={"Authorization": f"Bearer {key}"}, params={"limit": 1})
    assert r.status_code == 200, r.text
    return r.json()


def told(before: dict, after: dict) -> Counter:
    return Counter({k: after["tool_events"][k] - before["tool_events"][k] for k in COUNTS})


def plan_forecasts(stats_: dict) -> int:
    """Forecasts made from an agent an app's plan names."""
    return stats_["forecasters"].get("plan", {}).get("known_agent", 0)


@pytest.mark.frameworks
@pytest.mark.parametrize(
    ("app", "expected"),
    [
        (LANGGRAPH_GRAPH, Counter(plan=1, next=3)),
        (AUTOGEN_TEAMS.replace("sys.argv[2]", '"round-robin"'), Counter(plan=1, next=4, agent_done=2)),
        (CREWAI_CREW, Counter(plan=1, next=2, agent_done=3)),
    ],
    ids=["langgraph", "autogen-round-robin", "crewai-sequential"],
)
def test_an_unseen_apps_plan_and_decisions_reach_the_server_and_its_first_workflow_is_forecast_from_it(
    server, app, expected
):
    before = stats(server)
    workflow = run_app(app, server.base_url, API_KEY)
    after = stats(server)
    assert told(before, after) == expected
    requests = server.client.get(f"/agentcache/v1/workflows/{workflow}").json()["requests"]
    # Every request after the first is forecast from the plan (the plan goes out before the first request, on the
    # events channel: it may reach the server just after it).
    assert plan_forecasts(after) - plan_forecasts(before) >= requests - 1, after["forecasters"]


def generate(server, key: str, workflow: str, agent: str, app: str) -> None:
    tags = {"v": 1, "workflow": workflow, "agent": f"a:{agent}", "agent_name": agent, "app": app}
    request = {
        "input_ids": [41, 42, 43, 44],
        "sampling_params": {"max_new_tokens": 1, "custom_params": {"agentcache": tags}},
    }
    headers = {"Authorization": f"Bearer {key}"}
    server.client.post("/generate", json=request, headers=headers).raise_for_status()


def test_one_tenants_plan_never_reaches_another_tenants_forecasts(server):
    """Tenant A tells the plan of its app "iso-plan"; tenant B's workflow of an app of the same name, with agents of
    the same names, is forecast without it; A's own workflow from it."""
    a, b = TENANT_KEYS["tenant-a"], TENANT_KEYS["tenant-b"]
    plan = {"type": "plan", "app": "iso-plan", "plan": {"graph": {"planner": ["coder"], "coder": []}}}
    r = server.client.post(
        "/agentcache/v1/events",
        content=json.dumps({"events": [plan]}),
        headers={"Authorization": f"Bearer {a}", "content-type": "application/json"},
    )
    assert r.json() == {"accepted": 1, "skipped": 0}, r.text
    before = plan_forecasts(stats(server))
    for agent in ("planner", "coder"):
        generate(server, b, "iso-plan-b", agent, "iso-plan")
    assert plan_forecasts(stats(server)) == before, "B's workflow is not forecast from A's plan"
    for agent in ("planner", "coder"):
        generate(server, a, "iso-plan-a", agent, "iso-plan")
    assert plan_forecasts(stats(server)) == before + 2, "A's is, from its first request"
