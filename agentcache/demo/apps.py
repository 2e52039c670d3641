"""The demo's two agent apps, written against the plain `openai` SDK, and how a run tells its server where
each workflow starts and ends.

A code assistant whose coder runs the tests and reads their output until they pass (planner, coder,
reviewer) and a fact checker whose retriever searches and reads the results, hop after hop, before a verifier
decides (and sometimes sends it back). Every call sends the agent's fixed prompt and the workflow's history so
far, which grows with each answer and each tool's output; a tool's result goes back to the agent that called
it, as in agent frameworks, and the SDK tells the plugin's server while the agent waits on it. Each app also
tells the server what a framework would know (docs/usage.md): its graph of who may call after whom, once, and
each routing decision as soon as it is made (`ac.next_agents`), never before. The model is random-weight, so the
apps' branches are decided by a seeded random generator: every policy sees exactly the same workflows.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentcache.bench.workload import Lifecycle, Sent, end

WORDS = (
    "agent plan code test review tool schema result error retry analyze verify claim evidence search passage "
    "function argument return value python module import class method string integer list dict assert "
    "failure success report summary step task context answer question source document"
).split()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} for the team",
            "parameters": {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]},
        },
    }
    for name in ("run_tests", "search_web", "read_file", "write_file")
]

# How long each tool runs, on average (each call 0.5x to 1.5x): a test suite takes far longer than a search, as in
# real apps, so whose history is needed next depends on which tool each workflow waits for.
TOOL_PAUSES_S = {"run_tests": 0.8, "search_web": 0.3}

CODE_ASSISTANT, FACT_CHECKER = "code-assistant", "fact-checker"
# Each app's graph, as its framework would declare it: the agents that may call after each one.
GRAPHS = {
    CODE_ASSISTANT: {"planner": ["coder"], "coder": ["coder", "reviewer"], "reviewer": []},
    FACT_CHECKER: {"decomposer": ["retriever"], "retriever": ["retriever", "verifier"], "verifier": ["retriever"]},
}

# The SGLang session of the workflow running in this task (session-* runs only): each call carries it.
_session: ContextVar[str | None] = ContextVar("agentcache_demo_session", default=None)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _system_prompt(role: str, words: int) -> str:
    rng = random.Random(role)  # the same agent always has the same fixed prompt
    return f"You are the {role} of a multi-agent team. " + _text(rng, words)


@dataclass
class DemoApps:
    """The two apps; every LLM call goes through `chat`, which records latency and cached tokens."""

    client: Any  # openai.AsyncOpenAI
    model: str
    system_words: int = 60
    task_words: int = 40
    tool_words: int = 60
    max_tokens: int = 8
    tool_pauses_s: dict[str, float] = field(default_factory=lambda: dict(TOOL_PAUSES_S))
    records: list[Sent] = field(default_factory=list)
    on_answer: Callable[[], None] | None = None

    async def chat(self, role: str, history: list[dict[str, str]]) -> str:
        """One streamed call: time to the first token, latency, and the server's own token counts."""
        import agentcache_sdk as ac

        messages = [{"role": "system", "content": _system_prompt(role, self.system_words)}, *history]
        session = _session.get()
        start = time.perf_counter()
        first = None
        text: list[str] = []
        usage = None
        with ac.agent_name(role):
            stream = await self.client.chat.completions.create(
                model=self.model,
                messages=messages,
                max_tokens=self.max_tokens,
                temperature=0,
                tools=TOOLS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"session_id": session} if session is not None else None,
            )
            async for chunk in stream:
                if chunk.choices and first is None:
                    first = time.perf_counter()
                if chunk.choices and chunk.choices[0].delta.content:
                    text.append(chunk.choices[0].delta.content)
                usage = chunk.usage or usage
        done = time.perf_counter()
        details = getattr(usage, "prompt_tokens_details", None)
        cached = getattr(details, "cached_tokens", 0) or 0
        prompt = usage.prompt_tokens if usage is not None else 0
        self.records.append(Sent((first or done) - start, done - start, prompt, cached))
        if self.on_answer is not None:
            self.on_answer()
        return "".join(text)

    async def tool(self, rng: random.Random, history: list[dict[str, str]], name: str, caller: str) -> None:
        """Run `caller`'s tool call: the SDK tells the server the agent waits on it (inside a workflow of ours;
        a no-op elsewhere), so the cache can keep what the agent reads when the result comes back."""
        import agentcache_sdk as ac

        with ac.tool_call(name, agent=caller):
            await asyncio.sleep(self.tool_pauses_s.get(name, 0.0) * rng.uniform(0.5, 1.5))
        history.append({"role": "user", "content": f"[{name} output] " + _text(rng, self.tool_words)})

    async def code_assistant(self, seed: int) -> None:
        """planner -> coder, who runs the tests and reads their output until they pass (at most 3 runs) ->
        reviewer."""
        import agentcache_sdk as ac

        rng = random.Random(seed)
        history = [{"role": "user", "content": "Task: " + _text(rng, self.task_words)}]
        history.append({"role": "assistant", "content": await self.chat("planner", history)})
        history.append({"role": "assistant", "content": await self.chat("coder", history)})
        for attempt in range(3):
            await self.tool(rng, history, "run_tests", "coder")
            history.append({"role": "assistant", "content": await self.chat("coder", history)})
            if attempt == 2 or rng.random() < 0.4:  # the tests passed
                ac.next_agents("reviewer")  # the router's decision, made on the coder's answer
                break
        history.append({"role": "assistant", "content": await self.chat("reviewer", history)})

    async def fact_checker(self, seed: int) -> None:
        """decomposer -> retriever, who searches and reads the results (each may call for another search) ->
        verifier, which may ask for more."""
        import agentcache_sdk as ac

        rng = random.Random(seed)
        history = [{"role": "user", "content": "Claim: " + _text(rng, self.task_words)}]
        history.append({"role": "assistant", "content": await self.chat("decomposer", history)})
        for _round in range(2):
            history.append({"role": "assistant", "content": await self.chat("retriever", history)})
            for _hop in range(3):
                await self.tool(rng, history, "search_web", "retriever")
                history.append({"role": "assistant", "content": await self.chat("retriever", history)})
                if rng.random() < 0.5:
                    ac.next_agents("verifier")
                    break
            history.append({"role": "assistant", "content": await self.chat("verifier", history)})
            if rng.random() < 0.6:  # enough evidence
                break
            ac.next_agents("retriever")


@contextlib.asynccontextmanager
async def as_workflow(app: str, lifecycle: Lifecycle, base_url: str, headers: dict[str, str]) -> AsyncIterator[None]:
    """One run of `app` as its server knows workflows: the SDK's workflow (agentcache: tagged calls, the app's
    plan and decisions, an end event at the end), an SGLang session (each call carries its id; closed at the
    end), or nothing (plain SGLang)."""
    import agentcache_sdk as ac

    if lifecycle is Lifecycle.PLUGIN:
        async with ac.workflow(app=app):
            ac.plan(graph=GRAPHS[app])  # sent once per app, with its first request
            yield
    elif lifecycle is Lifecycle.SESSIONS:
        session = f"demo-{uuid.uuid4().hex}"
        token = _session.set(session)
        try:
            yield
        finally:
            _session.reset(token)
        async with httpx.AsyncClient(headers=headers, timeout=60) as client:
            await end(client, base_url, session, lifecycle)
    else:
        yield


async def run_workflows(
    apps: DemoApps,
    workflows: int,
    concurrency: int,
    seed: int,
    *,
    lifecycle: Lifecycle = Lifecycle.PLUGIN,
    base_url: str = "",
    headers: dict[str, str] | None = None,
) -> None:
    """Run `workflows` app runs, `concurrency` at a time, each one workflow as `lifecycle` says its server knows
    them (`base_url`, `headers`: where a session is closed)."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with semaphore:
            app = CODE_ASSISTANT if i % 2 == 0 else FACT_CHECKER
            run = apps.code_assistant if app == CODE_ASSISTANT else apps.fact_checker
            async with as_workflow(app, lifecycle, base_url, headers or {}):
                await run(seed * 1000 + i)

    await asyncio.gather(*(one(i) for i in range(workflows)))
