"""A live bench's workload: a trace turned into streamed `/generate` requests with token ids, sent at its times."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

import httpx

from agentcache.bench.forms import FORMS, OURS, ClientForm, Ending
from agentcache.replay.results import calls_after_tools
from agentcache.trace import AgentDone, End, Event, Next, Request, ToolEvent, Trace

# The default workload: a group chat (agents take turns on a shared, growing conversation), small enough to
# run in minutes on 2 cores, sent fast enough that requests overlap and the cache is contended.
BENCH_FAMILY, BENCH_WORKFLOWS, BENCH_SEED = "group-chat", 16, 7
TOKEN_SCALE = 0.35  # default scale of segment sizes: CPU prefill is slow
MAX_NEW_TOKENS = 4  # default cap on tokens generated per request
TIME_SCALE = 0.1  # default scale of the trace's send times


class BenchError(RuntimeError):
    """A bench that cannot run (a server that does not start, a workload that fails): says what and where."""


class TokenMaker:
    """Deterministic token ids per content id, scaled in length, inside the model's vocabulary."""

    def __init__(self, vocab_size: int, scale: float):
        self.low, self.high = 10, max(11, vocab_size - 10)
        self.scale = scale
        self._cache: dict[str, list[int]] = {}

    def segment(self, content_id: str, tokens: int) -> list[int]:
        ids = self._cache.get(content_id)
        if ids is None:
            rng = random.Random(content_id)
            n = scaled_tokens(tokens, self.scale)
            ids = self._cache[content_id] = [rng.randrange(self.low, self.high) for _ in range(n)]
        return ids

    def prompt(self, request: Request) -> tuple[list[int], int]:
        """(token ids, fixed-prompt boundary in tokens)."""
        ids: list[int] = []
        fixed = 0
        for i, seg in enumerate(request.segments):
            ids += self.segment(seg.content_id, seg.tokens)
            if i + 1 == request.fixed:
                fixed = len(ids)
        return ids, fixed


def scaled_tokens(tokens: int, scale: float) -> int:
    return max(1, round(tokens * scale))


def capped_output(output: int, max_new_tokens: int) -> int:
    return max(1, min(output, max_new_tokens))


def as_served(trace: Trace, token_scale: float = TOKEN_SCALE, max_new_tokens: int = MAX_NEW_TOKENS) -> Trace:
    """The trace as a bench run's server sees it, for a replay of exactly that workload: segments scaled as
    TokenMaker scales them, outputs capped as the requests cap them, and no output reused (the model's own
    output replaces the trace's, so a later prompt that re-sends the trace's output computes it afresh)."""
    events: list[Event] = []
    for e in trace.events:
        if isinstance(e, Request):
            segments = tuple(s._replace(tokens=scaled_tokens(s.tokens, token_scale)) for s in e.segments)
            e = replace(e, segments=segments, output=capped_output(e.output, max_new_tokens), output_id=None)
        events.append(e)
    return Trace(trace.meta, events)


def first_workflows(trace: Trace, workflows: int | None) -> Trace:
    """The trace cut to its first `workflows` workflows (all of them when None)."""
    if workflows is None:
        return trace
    keep: dict[str, None] = {}
    for e in trace.events:
        if isinstance(e, Request) and e.workflow not in keep:
            if len(keep) == workflows:
                continue
            keep[e.workflow] = None
    return Trace(trace.meta, [e for e in trace.events if e.workflow in keep])


class Lifecycle(Enum):
    """How a run tells its server where workflows end, and whether it hears tool calls (every request carries its
    tags either way)."""

    PLUGIN = "plugin"  # agentcache's server: an End event goes to its end route, tool events to its events route
    SESSIONS = "sessions"  # SGLang's session cache: each workflow a session (top-level session_id), closed at its End
    NONE = "none"  # plain SGLang: it has no notion of workflows


@dataclass
class Sent:
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    workflow: str | None = None  # None: a run that does not say (the demo's)
    after_tool: bool = False  # the agent's first call after its tool ended
    sent_s: float = 0.0  # when it was sent, from the run's start


@dataclass
class Workload:
    """A trace turned into requests: per workflow, its events with their prompts."""

    trace: Trace
    tokens: TokenMaker
    time_scale: float
    max_new_tokens: int

    @property
    def requests(self) -> int:
        return len(self.trace.requests)

    async def drive(
        self,
        base_url: str,
        headers: dict[str, str],
        *,
        lifecycle: Lifecycle,
        on_answer: Callable[[], None] | None = None,
        form: ClientForm = FORMS[OURS],
    ) -> tuple[list[Sent], float]:
        """Send the whole workload; every answer, and the completion time (first request to last answer).

        With sessions, a workflow that never ends keeps its session open, as on a real server. The trace's tool
        events go to the plugin's events route at their times (a workflow's each after its call before it was
        answered, as a client's come); so do its plan (first, under the app its requests then name) and its next
        and agent_done events; a server without the plugin has no such route and hears none. On the plugin, `form`
        names each request's workflow and agent, and ends the workflow, as that client's stack does
        (agentcache/bench/forms.py); a form other than ours sends no events (it has no route for them)."""
        after_tool = calls_after_tools(self.trace.events)
        told = lifecycle is Lifecycle.PLUGIN and form.name == OURS  # the events route hears the trace's events
        plan = self.trace.meta.plan if told else None
        app = (self.trace.meta.name or "bench") if plan is not None else None
        by_workflow: dict[str, list[tuple[Request | End | ToolEvent | Next | AgentDone, bool]]] = {}
        requests = 0
        for e in self.trace.events:
            if isinstance(e, (ToolEvent, Next, AgentDone)) and not told:
                continue
            by_workflow.setdefault(e.workflow, []).append((e, isinstance(e, Request) and requests in after_tool))
            requests += isinstance(e, Request)
        finals = last_requests_of_ended(self.trace.events)
        sent: list[Sent] = []
        start = time.monotonic()
        last_answer = start

        async def run(client: httpx.AsyncClient, events: list[Any]) -> None:
            nonlocal last_answer
            for e, follows_tool in events:
                delay = e.ts * self.time_scale - (time.monotonic() - start)
                if delay > 0:
                    await asyncio.sleep(delay)
                if isinstance(e, End):
                    await end(client, base_url, e.workflow, lifecycle, form)
                    continue
                if isinstance(e, (ToolEvent, Next, AgentDone)):
                    await client_event(client, base_url, e.to_json())
                    continue
                ids, fixed = self.tokens.prompt(e)
                params = {"max_new_tokens": capped_output(e.output, self.max_new_tokens), "temperature": 0}
                body: dict[str, Any] = {"input_ids": ids, "sampling_params": params}
                tagging = form if lifecycle is Lifecycle.PLUGIN else FORMS[OURS]  # plain SGLang: as ever, our tags
                headers = tagging.tag(body, e.workflow, e.agent, fixed, id(e) in finals, app)
                if lifecycle is Lifecycle.SESSIONS:  # SGLang's radix-native session: the top-level id alone
                    body["session_id"] = e.workflow
                sent_s = time.monotonic() - start
                answer = await generate(client, base_url, body, headers)
                answer.workflow, answer.after_tool, answer.sent_s = e.workflow, follows_tool, sent_s
                sent.append(answer)
                last_answer = max(last_answer, time.monotonic())
                if on_answer is not None:
                    on_answer()

        async with httpx.AsyncClient(timeout=900, headers=headers) as client:
            if plan is not None:
                await client_event(client, base_url, {"type": plan.TYPE, "app": app, "plan": plan.to_json()})
            await asyncio.gather(*(run(client, events) for events in by_workflow.values()))
        return sent, last_answer - start


def last_requests_of_ended(events: list[Event]) -> set[int]:
    """The ids (`id()`) of each ended workflow's last request: where a form that ends on a final request says so."""
    last: dict[str, Request] = {}
    finals: set[int] = set()
    for e in events:
        if isinstance(e, Request):
            last[e.workflow] = e
        elif isinstance(e, End) and e.workflow in last:
            finals.add(id(last.pop(e.workflow)))
    return finals


async def end(
    client: httpx.AsyncClient, base_url: str, workflow: str, lifecycle: Lifecycle, form: ClientForm = FORMS[OURS]
) -> None:
    """A workflow's End event, as its server hears it: the plugin's end route (or, in another client's form, its
    session's close, or nothing where its last request said so or its lease will), or the close of its session."""
    if lifecycle is Lifecycle.PLUGIN and form.ending is Ending.ROUTE:
        r = await client.post(f"{base_url}/agentcache/v1/workflows/{workflow}/end")
    elif lifecycle is Lifecycle.SESSIONS or (lifecycle is Lifecycle.PLUGIN and form.ending is Ending.CLOSE_SESSION):
        r = await client.post(f"{base_url}/close_session", json={"session_id": workflow})
    else:
        return
    if r.is_error:
        raise BenchError(f"{r.request.url} answered {r.status_code}: {r.text.strip()[:300]}")


async def client_event(client: httpx.AsyncClient, base_url: str, event: dict[str, Any]) -> None:
    """One of the trace's events (a tool call's start or end, a plan, next, agent_done) as the SDK tells the
    plugin: without its time (the server stamps its own clock on arrival)."""
    body = {"events": [{k: v for k, v in event.items() if k != "ts"}]}
    r = await client.post(f"{base_url}/agentcache/v1/events", json=body)
    if r.is_error:
        raise BenchError(f"{r.request.url} answered {r.status_code}: {r.text.strip()[:300]}")


async def generate(
    client: httpx.AsyncClient, base_url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Sent:
    """One streamed /generate: time to the first token, latency, and the server's own token counts."""
    started = time.perf_counter()
    first: float | None = None
    meta: dict[str, Any] = {}
    async with client.stream("POST", f"{base_url}/generate", json={**body, "stream": True}, headers=headers) as r:
        if r.status_code != 200:
            raise BenchError(f"{base_url}/generate answered {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            meta = chunk.get("meta_info") or meta
            if first is None and (chunk.get("output_ids") or meta.get("completion_tokens", 0) > 0):
                first = time.perf_counter()
    done = time.perf_counter()
    return Sent(
        ttft_s=(first or done) - started,
        latency_s=done - started,
        prompt_tokens=int(meta.get("prompt_tokens", 0)),
        cached_tokens=int(meta.get("cached_tokens", 0)),
    )
