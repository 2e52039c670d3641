"""A LangGraph code assistant with a test-and-retry loop and a test tool, wrapped with agentcache's one decorator.

    START -> planner -> coder -> tester --(asks for run_tests)--> tools (ToolNode) -> tester
                          ^        |
                          +- analyzer <-(failed)   tester --(passed, or 3 attempts)--> END

    .venv/bin/python examples/langgraph_code_assistant.py --workflows 6 --json

The graph is built the way LangGraph's docs build one (the tester's model is
bound to its tool, a ToolNode runs it); the only agentcache line is the
decorator on `solve`, whose integration reports each tool call from
LangChain's callbacks. The served model has random weights, so it never asks
for the tool by itself: after the tester's first call its answer is scripted
to ask for `run_tests` (as a model would), and whether the tests pass is a
seeded coin flip, never read from its text. The tool takes a seeded fraction
of a second.
"""

from __future__ import annotations

import asyncio
import random
from typing import Annotated, TypedDict

from _support import parse_args, report, run_workflows, server
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

from agentcache.integrations.langgraph import workflow

SYSTEM = {
    "planner": "You are a senior software architect. Break the user's task into a short, numbered plan. " * 6,
    "coder": "You are an expert Python programmer. Write complete, runnable code for the plan. Return only code. " * 6,
    "tester": "You are a meticulous QA engineer. Write pytest tests and report which would fail and why. " * 6,
    "analyzer": "You are a debugging expert. Explain the root cause of the failing tests and how to fix it. " * 6,
}
TASKS = [
    "Implement an LRU cache with O(1) get and put.",
    "Parse ISO-8601 durations into seconds.",
    "Implement Dijkstra's shortest path on an adjacency list.",
    "Write a thread-safe token bucket rate limiter.",
]
MAX_ATTEMPTS = 3
tool_calls = 0  # run_tests calls, for the --json summary


@tool
async def run_tests(seed: str) -> str:
    """Run the project's test suite and report which tests failed."""
    global tool_calls
    tool_calls += 1
    await asyncio.sleep(random.Random(seed).uniform(0.05, 0.25))
    return "3 passed, 1 failed: test_evicts_least_recent"


def tool_turn(old: list[BaseMessage], new: list[BaseMessage]) -> list[BaseMessage]:
    """The tester's call of its tool, then the tool's answer (the ToolNode's update) after it; [] clears them."""
    return [*old, *new] if new else []


class State(TypedDict, total=False):
    task: str
    seed: str
    history: list[str]
    messages: Annotated[list[BaseMessage], tool_turn]  # the tester's tool call and its answer (the ToolNode's)
    attempts: int
    passed: bool


def build(llm: ChatOpenAI):
    tester_llm = llm.bind_tools([run_tests])

    def node(name: str):
        async def run(state: State) -> State:
            messages = [
                SystemMessage(SYSTEM[name]),
                HumanMessage("\n\n".join([state["task"], *state.get("history", [])])),
            ]
            if name != "tester":
                reply = await llm.ainvoke(messages)
                return {"history": [*state.get("history", []), f"[{name}] {reply.content}"]}
            attempts = state.get("attempts", 0) + 1
            asked = state.get("messages") or []
            if not asked:  # the tester writes its tests and asks to run them (the model's answer scripted)
                reply = await tester_llm.ainvoke(messages)
                call = {"name": "run_tests", "args": {"seed": f"{state['seed']}:{attempts}"}, "id": f"call-{attempts}"}
                return {"messages": [AIMessage(reply.content, tool_calls=[call])]}
            # ... and reads the results: its next call extends the prompt it paused on
            reply = await tester_llm.ainvoke(messages + asked)
            return {
                "history": [*state.get("history", []), f"[tester] {reply.content}"],
                "messages": [],
                "attempts": attempts,
                "passed": random.Random(f"{state['seed']}:{attempts}").random() < 0.4,
            }

        return run

    def after_tester(state: State) -> str:
        if state.get("messages"):
            return "tools"
        return END if state["passed"] or state["attempts"] >= MAX_ATTEMPTS else "analyzer"

    graph = StateGraph(State)
    for name in SYSTEM:
        graph.add_node(name, node(name))
    graph.add_node("tools", ToolNode([run_tests]))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "coder")
    graph.add_edge("coder", "tester")
    graph.add_conditional_edges("tester", after_tester, {"tools": "tools", "analyzer": "analyzer", END: END})
    graph.add_edge("tools", "tester")
    graph.add_edge("analyzer", "coder")
    return graph.compile()


async def main() -> None:
    args = parse_args(__doc__.splitlines()[0])
    with server(args) as base_url:
        llm = ChatOpenAI(
            base_url=base_url, api_key=args.api_key or "none", model="default", max_tokens=8, temperature=0
        )
        app = build(llm)

        async def solve(i: int) -> None:
            await app.ainvoke({"task": TASKS[i % len(TASKS)], "seed": f"{args.seed}:{i}", "history": []})

        report(args, await run_workflows(args, solve, workflow, "code-assistant"), tool_calls)


if __name__ == "__main__":
    asyncio.run(main())
