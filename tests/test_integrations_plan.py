"""The integrations read each framework's plan and decisions and send them (against the small local server of the
SDK's tests): a LangGraph graph with a conditional edge and a tool node, an AutoGen RoundRobinGroupChat with a
turn limit and a SelectorGroupChat, a sequential CrewAI crew. Each app runs in a process of its own (each
framework hooked as an app loads it). The live server: tests/test_plan_events_e2e.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import test_sdk_tool_events

pytestmark = pytest.mark.frameworks

fake = test_sdk_tool_events.fake  # the small local server, as a fixture here too


def run_app(app: str, base_url: str, api_key: str | None = None) -> str:
    """Run one of the apps below against a server; its workflow's id."""
    env = {**os.environ, "AGENTCACHE_API_KEY": api_key} if api_key else None
    done = subprocess.run([sys.executable, "-c", app, base_url], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])["workflow"]


def run(app: str, fake) -> tuple[str, list[dict], list[dict]]:  # noqa: ANN001
    """(the app's workflow, its plan events, its decisions) as the server received them."""
    workflow = run_app(app, fake.url)
    events = [e for e in fake.events() if e["type"] in ("plan", "next", "agent_done")]
    return workflow, [e for e in events if e["type"] == "plan"], [e for e in events if e["type"] != "plan"]


def speakers(fake) -> list[str]:  # noqa: ANN001
    bodies = [body for path, body, _ in fake.received if path.endswith("/chat/completions")]
    return [body["custom_params"]["agentcache"].get("agent_name") for body in bodies]


AUTOGEN_TEAMS = """
import asyncio, json, os, sys
import agentcache_sdk as ac
from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.teams import RoundRobinGroupChat, SelectorGroupChat, Swarm
from autogen_core.models import ModelFamily, ModelInfo
from autogen_ext.models.openai import OpenAIChatCompletionClient
from agentcache.integrations.autogen import workflow

ac.configure(base_url=sys.argv[1])
info = ModelInfo(vision=False, function_calling=True, json_output=False, family=ModelFamily.UNKNOWN,
                 structured_output=False)
client = OpenAIChatCompletionClient(model="default", base_url=sys.argv[1] + "/v1", model_info=info, max_tokens=8,
                                    api_key=os.environ.get("AGENTCACHE_API_KEY", "x"))
agents = lambda: [AssistantAgent(n, model_client=client, system_message=f"You are the {n}.") for n in TEAM]
TEAM = ["planner", "coder", "critic"]


@workflow(app=sys.argv[2])
async def solve():
    if sys.argv[2] == "round-robin":
        team = RoundRobinGroupChat(agents(), max_turns=5)
    elif sys.argv[2] == "swarm":  # the planner hands off to the coder (the fake model calls the handoff tool)
        planner = AssistantAgent("planner", model_client=client, handoffs=["coder"], system_message="Plan.")
        coder = AssistantAgent("coder", model_client=client, system_message="Code.")
        team = Swarm([planner, coder], max_turns=3)
    else:  # the fake model answers "done": the selector's answer names no one, so it keeps to its fallback
        team = SelectorGroupChat(agents(), model_client=client, termination_condition=MaxMessageTermination(4))
    await team.run(task="fix it")
    return ac.current_workflow().id


print(json.dumps({"workflow": asyncio.run(solve())}))
"""


def test_a_round_robin_sends_its_order_and_turn_limit_each_speaker_as_chosen_and_agents_without_turns(fake):
    workflow, plans, decisions = run(AUTOGEN_TEAMS.replace("sys.argv[2]", '"round-robin"'), fake)
    assert plans == [{"type": "plan", "app": "round-robin", "plan": {"order": ["planner", "coder", "critic"],
                                                                      "max_turns": 5}}]  # fmt: skip
    assert speakers(fake) == ["planner", "coder", "critic", "planner", "coder"]
    # The first choice comes before any request (the server does not know the workflow yet): the plan's order
    # says it. Each later one is sent as chosen; once turns 4 and 5 are chosen, the critic and then the planner
    # have no turn left.
    assert decisions == [
        {"type": "next", "workflow": workflow, "agents": ["coder"]},
        {"type": "next", "workflow": workflow, "agents": ["critic"]},
        {"type": "next", "workflow": workflow, "agents": ["planner"]},
        {"type": "agent_done", "workflow": workflow, "agent": "critic"},
        {"type": "next", "workflow": workflow, "agents": ["coder"]},
        {"type": "agent_done", "workflow": workflow, "agent": "planner"},
    ]


def test_a_swarm_sends_its_turn_limit_and_each_handoff_target_as_read(fake):
    workflow, plans, decisions = run(AUTOGEN_TEAMS.replace("sys.argv[2]", '"swarm"'), fake)
    assert plans == [{"type": "plan", "app": "swarm", "plan": {"max_turns": 3}}]
    assert speakers(fake) == ["planner", "coder", "coder"]
    assert decisions == [{"type": "next", "workflow": workflow, "agents": ["coder"]}] * 2


def test_a_selector_chat_sends_its_graph_and_each_choice_once_the_selector_answered(fake):
    workflow, plans, decisions = run(AUTOGEN_TEAMS.replace("sys.argv[2]", '"selector"'), fake)
    manager = "SelectorGroupChatManager"
    graph = {manager: ["planner", "coder", "critic"], "planner": [manager], "coder": [manager], "critic": [manager]}
    assert plans == [{"type": "plan", "app": "selector", "plan": {"graph": graph, "max_turns": 3}}]
    chosen = [s for s in speakers(fake) if s != manager]
    assert [d["agents"] for d in decisions] == [[s] for s in chosen]
    assert {d["workflow"] for d in decisions} == {workflow}


CREWAI_CREW = """
import json, os, sys, tempfile
home = tempfile.mkdtemp(prefix="agentcache-crewai-")
os.environ.update(CREWAI_DISABLE_TELEMETRY="true", CREWAI_DISABLE_TRACKING="true", OTEL_SDK_DISABLED="true",
                  CREWAI_DISABLE_VERSION_CHECK="true", CREWAI_TRACING_ENABLED="false", HOME=home,
                  CREWAI_STORAGE_DIR=os.path.join(home, "storage"))
import agentcache_sdk as ac
from crewai import LLM, Agent, Crew, Process, Task
from agentcache.integrations.crewai import workflow

ac.configure(base_url=sys.argv[1])
llm = LLM(model="openai/default", base_url=sys.argv[1] + "/v1", max_tokens=8,
          api_key=os.environ.get("AGENTCACHE_API_KEY", "x"))
agent = lambda role: Agent(role=role, goal=f"{role}'s goal", backstory="b", llm=llm, max_iter=1, max_retry_limit=0,
                           allow_delegation=False)
researcher, writer, editor = agent("researcher"), agent("writer"), agent("editor")
tasks = [Task(description=f"{a.role}'s task", expected_output="Plain text.", agent=a)
         for a in (researcher, writer, editor)]
crew = Crew(agents=[researcher, writer, editor], tasks=tasks, process=Process.sequential, verbose=False)


@workflow(app="crew")
def solve():
    crew.kickoff()
    ac.flush(5)
    return ac.current_workflow().id


print(json.dumps({"workflow": solve()}))
"""


def test_a_sequential_crew_sends_its_task_chain_up_front_and_each_task_done_with_the_next_agent(fake):
    workflow, plans, decisions = run(CREWAI_CREW, fake)
    roles = ["researcher", "writer", "editor"]
    chain = [["task 1", ["researcher"]], ["task 2", ["writer"]], ["task 3", ["editor"]]]
    assert plans == [{"type": "plan", "app": "crew", "plan": {"chain": chain, "order": roles}}]
    assert speakers(fake) == roles
    assert decisions == [
        {"type": "next", "workflow": workflow, "agents": ["writer"]},
        {"type": "agent_done", "workflow": workflow, "agent": "researcher"},
        {"type": "next", "workflow": workflow, "agents": ["editor"]},
        {"type": "agent_done", "workflow": workflow, "agent": "writer"},
        {"type": "agent_done", "workflow": workflow, "agent": "editor"},
    ]


LANGGRAPH_GRAPH = """
import asyncio, json, os, sys
from typing import Literal, TypedDict
import agentcache_sdk as ac
from langchain_core.messages import AIMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode
from agentcache.integrations.langgraph import workflow

ac.configure(base_url=sys.argv[1])
llm = ChatOpenAI(base_url=sys.argv[1] + "/v1", model="default", max_tokens=8,
                 api_key=os.environ.get("AGENTCACHE_API_KEY", "x"))


@tool
def run_tests() -> str:
    '''Run the tests.'''
    return "1 failed"


class State(TypedDict, total=False):
    messages: list
    attempts: int


def node(name):
    async def run(state):
        await llm.ainvoke([SystemMessage(f"You are the {name}.")])
        if name != "tester":
            return {}
        if not state.get("messages"):  # asks for its tool (scripted: the fake model asks for none)
            call = {"name": "run_tests", "args": {}, "id": f"call-{state.get('attempts', 0)}"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [], "attempts": state.get("attempts", 0) + 1}
    return run


def after_tester(state) -> Literal["tools", "analyzer", "__end__"]:
    if state.get("messages"):
        return "tools"
    return END if state["attempts"] >= 2 else "analyzer"


graph = StateGraph(State)
for name in ("planner", "coder", "tester", "analyzer"):
    graph.add_node(name, node(name))
graph.add_node("tools", ToolNode([run_tests]))
graph.add_edge(START, "planner")
graph.add_edge("planner", "coder")
graph.add_edge("coder", "tester")
graph.add_conditional_edges("tester", after_tester)
graph.add_edge("tools", "tester")
graph.add_edge("analyzer", "coder")
app = graph.compile()


@workflow(app="graph")
async def solve():
    await app.ainvoke({"messages": []}, {"recursion_limit": 40})
    return ac.current_workflow().id


print(json.dumps({"workflow": asyncio.run(solve())}))
"""


def test_a_graph_sends_its_nodes_and_edges_past_its_tool_node_and_each_routers_answer_as_it_returns(fake):
    workflow, plans, decisions = run(LANGGRAPH_GRAPH, fake)
    graph = {"planner": ["coder"], "coder": ["tester"], "tester": ["analyzer", "tester"], "analyzer": ["coder"]}
    assert plans == [{"type": "plan", "app": "graph", "plan": {"graph": graph, "max_turns": 40}}]
    calls = speakers(fake)
    assert calls == ["planner", "coder", "tester", "tester", "analyzer", "coder", "tester", "tester"]
    # The router's answer "tools" runs the tool node, then the tester: the tester is next, decided before the
    # tool runs; then "analyzer"; END decides no agent.
    assert [d["agents"] for d in decisions] == [["tester"], ["analyzer"], ["tester"]]
    assert {d["workflow"] for d in decisions} == {workflow}


LANGGRAPH_COMMANDS = """
import asyncio, json, os, sys
from typing import TypedDict
import agentcache_sdk as ac
from langchain_core.messages import SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import START, StateGraph
from langgraph.types import Command
from agentcache.integrations.langgraph import workflow

ac.configure(base_url=sys.argv[1])
llm = ChatOpenAI(base_url=sys.argv[1] + "/v1", model="default", max_tokens=8,
                 api_key=os.environ.get("AGENTCACHE_API_KEY", "x"))


class State(TypedDict, total=False):
    done: list


async def supervisor(state):
    await llm.ainvoke([SystemMessage("You are the supervisor.")])
    done = state.get("done", [])
    return Command(goto="__end__" if len(done) == 2 else ["researcher", "writer"][len(done)])


def worker(name):
    async def run(state):
        await llm.ainvoke([SystemMessage(f"You are the {name}.")])
        return {"done": [*state.get("done", []), name]}
    return run


graph = StateGraph(State)
graph.add_node("supervisor", supervisor, destinations=("researcher", "writer"))
graph.add_node("researcher", worker("researcher"))
graph.add_node("writer", worker("writer"))
graph.add_edge(START, "supervisor")
graph.add_edge("researcher", "supervisor")
graph.add_edge("writer", "supervisor")
app = graph.compile()


@workflow(app="supervised")
async def solve():
    await app.ainvoke({})
    return ac.current_workflow().id


print(json.dumps({"workflow": asyncio.run(solve())}))
"""


def test_a_node_routing_by_command_sends_its_destinations_as_the_plan_and_each_goto_as_it_returns(fake):
    workflow, plans, decisions = run(LANGGRAPH_COMMANDS, fake)
    graph = {"supervisor": ["researcher", "writer"], "researcher": ["supervisor"], "writer": ["supervisor"]}
    assert plans == [{"type": "plan", "app": "supervised", "plan": {"graph": graph}}]
    assert speakers(fake) == ["supervisor", "researcher", "supervisor", "writer", "supervisor"]
    assert decisions == [
        {"type": "next", "workflow": workflow, "agents": ["researcher"]},
        {"type": "next", "workflow": workflow, "agents": ["writer"]},
    ]


def test_a_hierarchical_managers_delegation_names_the_coworker_next(fake, monkeypatch):
    """CrewAI's manager delegates with its delegation tool, naming the coworker, before the coworker's call runs."""
    from types import SimpleNamespace

    import openai

    import agentcache_sdk as ac
    from agentcache.integrations import crewai as integration

    monkeypatch.setattr(integration, "_DELEGATION", {"delegate_work_to_coworker"})
    client = openai.OpenAI(base_url=f"{fake.url}/v1", api_key="x")
    manager = SimpleNamespace(role="Crew Manager")
    with ac.workflow(app="crew") as wf, ac.agent_name("Crew Manager"):
        client.chat.completions.create(model="m", messages=[{"role": "system", "content": "You manage."}])
        context = SimpleNamespace(
            tool_name="delegate_work_to_coworker", tool_input={"coworker": "writer", "task": "t"}, agent=manager
        )
        integration._before_tool_call(context)
        integration._after_tool_call(context)
    assert ac.flush(5)
    assert [e for e in fake.events() if e["type"] == "next"] == [
        {"type": "next", "workflow": wf.id, "agents": ["writer"]}
    ]
