"""A LangGraph code assistant with a test-and-retry loop, wrapped with agentcache's one decorator.

    START -> planner -> coder -> tester --(passed, or 3 attempts)--> END
                          ^        |
                          +- analyzer <-(failed)

    .venv/bin/python examples/langgraph_code_assistant.py --workflows 6 --json

The graph is built the way LangGraph's docs build one; the only agentcache
line is the decorator on `solve`. The served model has random weights, so
whether the tests pass is a seeded coin flip, never read from its text.
"""

from __future__ import annotations

import asyncio
import random
from typing import TypedDict

from _support import parse_args, report, run_workflows, server
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

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


class State(TypedDict, total=False):
    task: str
    seed: str
    history: list[str]
    attempts: int
    passed: bool


def build(llm: ChatOpenAI):
    def node(name: str):
        async def run(state: State) -> State:
            messages = [
                SystemMessage(SYSTEM[name]),
                HumanMessage("\n\n".join([state["task"], *state.get("history", [])])),
            ]
            reply = await llm.ainvoke(messages)
            update: State = {"history": [*state.get("history", []), f"[{name}] {reply.content}"]}
            if name == "tester":
                attempts = state.get("attempts", 0) + 1
                update.update(attempts=attempts, passed=random.Random(f"{state['seed']}:{attempts}").random() < 0.4)
            return update

        return run

    graph = StateGraph(State)
    for name in SYSTEM:
        graph.add_node(name, node(name))
    graph.add_edge(START, "planner")
    graph.add_edge("planner", "coder")
    graph.add_edge("coder", "tester")
    graph.add_conditional_edges(
        "tester",
        lambda s: END if s["passed"] or s["attempts"] >= MAX_ATTEMPTS else "analyzer",
        {"analyzer": "analyzer", END: END},
    )
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

        report(args, await run_workflows(args, solve, workflow, "code-assistant"))


if __name__ == "__main__":
    asyncio.run(main())
