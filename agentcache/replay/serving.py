"""Time in the replay: a discrete-event model of SGLang workers serving a trace on one clock.

Each worker is SGLang's real radix cache with the policy under a model of
SGLang 0.5.23's scheduler (:mod:`agentcache.replay.scheduler` says what it
models); a client waits for each answer before its workflow's next call.
Several workers share one clock; a router chooses each request's worker when
it arrives. Figures: hit rate, time to first token and end-to-end latency
(median, p90, p99) and throughput, per worker and in total; the time to first
token of the calls that follow a tool (p50, p90: each the agent's first call
after its tool_end, which reads back what the pause left idle) and each
workflow's completion time (first request's arrival to last answer; p50,
p90). The seconds are the cost model's (an 8B model on one H100, docs/results/serving-model.md states its
anchors), not measurements.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import PolicySpec, WorkflowRegistry
from agentcache.predictor import Predictor
from agentcache.replay.results import calls_after_tools, quantile
from agentcache.replay.runner import (
    HINTS,
    Hint,
    PreparedTrace,
    as_spec,
    build_replay_cache,
    hear_hint,
    request_tags,
    tell_plan,
)
from agentcache.replay.scheduler import DEFAULT_PREFILL_BUDGET, Served, Worker
from agentcache.replay.tokens import EncodedRequest
from agentcache.trace import End, Request

Router = Callable[[Request, EncodedRequest, Sequence[Worker], float], int]


def single(_request: Request, _enc: EncodedRequest, _workers: Sequence[Worker], _now: float) -> int:
    return 0


@dataclass
class ServingResult:
    """A timed replay: every request's life, per worker and in total."""

    policy: str
    capacity: int  # per worker
    workers: int
    served: list[Served] = field(default_factory=list)
    evicted_tokens: list[dict[str, int]] = field(default_factory=list)
    busy_s: list[float] = field(default_factory=list)  # per worker: time spent in scheduler steps
    active_workflows: list[int] = field(default_factory=list)  # per worker, at the end: neither ended nor expired
    after_tool: set[int] = field(default_factory=set)  # the requests (trace places) that follow a tool

    def summary(self, worker: int | None = None) -> dict[str, Any]:
        rows = [s for s in self.served if worker is None or s.worker == worker]
        done = [s for s in rows if s.admitted]
        prompt = sum(s.prompt_tokens for s in done)
        hits = sum(s.hit_tokens for s in done)
        span = (max(s.finished for s in done) - min(s.arrival for s in rows)) if done else 0.0
        ttft = sorted(s.ttft_s for s in done)
        latency = sorted(s.latency_s for s in done)
        post_tool = sorted(s.ttft_s for s in done if s.index in self.after_tool)
        completion = sorted(workflow_completions(rows).values())
        return {
            "requests": len(rows),
            "oversized_requests": len(rows) - len(done),
            "retracted_requests": sum(s.retracted > 0 for s in done),
            "prompt_tokens": prompt,
            "hit_tokens": hits,
            "hit_rate": hits / prompt if prompt else 0.0,
            "computed_prompt_tokens": prompt - hits - sum(s.loaded_tokens for s in done),
            "ttft_p50_s": quantile(ttft, 0.5),
            "ttft_p90_s": quantile(ttft, 0.9),
            "ttft_p99_s": quantile(ttft, 0.99),
            "latency_p50_s": quantile(latency, 0.5),
            "latency_p90_s": quantile(latency, 0.9),
            "latency_p99_s": quantile(latency, 0.99),
            "makespan_s": span,
            "throughput_rps": len(done) / span if span > 0 else 0.0,
            "utilization": self.utilization(worker),
            "queue_wait_mean_s": sum(s.admitted_at - s.arrival for s in done) / len(done) if done else 0.0,
            # None where no call followed a tool (a trace without tool events)
            "post_tool_requests": len(post_tool),
            "post_tool_ttft_p50_s": quantile(post_tool, 0.5) if post_tool else None,
            "post_tool_ttft_p90_s": quantile(post_tool, 0.9) if post_tool else None,
            "workflow_completion_p50_s": quantile(completion, 0.5),
            "workflow_completion_p90_s": quantile(completion, 0.9),
        }

    def utilization(self, worker: int | None = None) -> float:
        """Share of the whole run (first arrival to last finish) a worker spent in steps; the mean over workers."""
        done = [s for s in self.served if s.admitted]
        if not done or not self.busy_s:
            return 0.0
        span = max(s.finished for s in done) - min(s.arrival for s in self.served)
        busy = self.busy_s if worker is None else [self.busy_s[worker]]
        return sum(busy) / (len(busy) * span) if span > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity": self.capacity,
            "workers": self.workers,
            **self.summary(),
            "per_worker": [self.summary(i) for i in range(self.workers)] if self.workers > 1 else [],
        }


def workflow_completions(served: Sequence[Served]) -> dict[str, float]:
    """Per workflow with an answered request: its first request's arrival to its last answer."""
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for s in served:
        first[s.workflow] = min(first.get(s.workflow, s.arrival), s.arrival)
        if s.admitted:
            last[s.workflow] = max(last.get(s.workflow, s.finished), s.finished)
    return {w: last[w] - first[w] for w in last}


def serve_trace(
    prepared: PreparedTrace,
    policy: PolicySpec | str,
    capacity: int,
    *,
    workers: int = 1,
    router: Router = single,
    on_end: Callable[[str, float], None] | None = None,
    on_finish: Callable[[Served], None] | None = None,
    cost: CostModel = DEFAULT_COST,
    time_scale: float = 1.0,
    prefill_budget: int = DEFAULT_PREFILL_BUDGET,
    max_running: int | None = None,
    host_capacity: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
) -> ServingResult:
    """The trace served by `workers` modelled workers of `capacity` KV tokens each, running `policy`.

    `router(request, encoded, workers, now)` picks a worker for each request as it arrives; `on_finish`
    hears each request finish (or be refused), `on_end` each workflow's end (a router's bookkeeping). End
    events and hints (tool, next and agent_done events) go to every worker that served the workflow. A hint is
    heard at its trace time, or once the request before it finished if that is later; it never delays a
    request, so requests are timed as in the trace without it. The trace's plan is told every worker at the
    start.
    """
    spec = as_spec(policy)
    if spec.prefetch is not None:
        raise ValueError(f"{spec.text}: prefetch variants are replayed untimed only")
    if time_scale <= 0:
        raise ValueError(f"time_scale must be > 0, got {time_scale}")
    current = [0]  # the request being routed, for the offline reference's look-ahead

    def next_use(node: Any) -> float:
        return prepared.next_use.next_use(node.key.token_ids[0], current[0])

    pool = [
        Worker(
            i,
            build_replay_cache(
                prepared,
                spec,
                capacity,
                host_capacity,
                predictor_factory(),
                WorkflowRegistry(lease_s=lease_s),
                next_use,
            ),
            cost,
            prefill_budget,
            max_running,
        )
        for i in range(workers)
    ]
    for worker in pool:
        tell_plan(worker.policy, prepared.trace)
    # Each workflow's events in order; a workflow's next event is due at its trace time, or when its
    # previous request finished, whichever is later.
    index_of = {id(r): i for i, r in enumerate(prepared.requests)}
    by_workflow: dict[str, deque[Request | End | Hint]] = {}
    for event in prepared.trace.events:
        by_workflow.setdefault(event.workflow, deque()).append(event)
    sequence = itertools.count()
    due: list[tuple[float, int, str]] = []
    # Hints on a clock of their own, so that requests and ends are ordered (ties too) as without them.
    hints_due: list[tuple[float, int, Hint]] = []
    hint_sequence = itertools.count()
    served_by: dict[str, set[int]] = {}

    def release(workflow: str, at: float) -> None:
        events = by_workflow[workflow]
        while events and isinstance(events[0], HINTS):
            hint = events.popleft()
            heapq.heappush(hints_due, (max(hint.ts * time_scale, at), next(hint_sequence), hint))
        if events:
            heapq.heappush(due, (max(events[0].ts * time_scale, at), next(sequence), workflow))

    # Workflows in the order their first request or end came (hints aside), as their first pushes were.
    first = dict.fromkeys(e.workflow for e in prepared.trace.events if not isinstance(e, HINTS))
    for workflow in {**first, **dict.fromkeys(by_workflow)}:
        release(workflow, 0.0)

    def hear_hints(until: float) -> None:
        while hints_due and hints_due[0][0] <= until:
            at, _, hint = heapq.heappop(hints_due)
            for i in served_by.get(hint.workflow, ()):
                hear_hint(pool[i].policy, hint, at)

    now = 0.0
    while due or hints_due or any(not w.idle for w in pool):
        # Deliver everything due by now (a hint before a request or end due at the same time); then start a step
        # on every free worker with work.
        hear_hints(now)
        while due and due[0][0] <= now:
            at, _, workflow = heapq.heappop(due)
            event = by_workflow[workflow].popleft()
            if isinstance(event, End):
                for i in served_by.get(workflow, ()):
                    pool[i].cache.end_workflow(workflow, at)
                if on_end is not None:
                    on_end(workflow, at)
                release(workflow, at)
                continue
            index = index_of[id(event)]
            current[0] = index
            enc = prepared.encoded[index]
            choice = router(event, enc, pool, at)
            served_by.setdefault(workflow, set()).add(choice)
            tags = request_tags(event, enc)
            worker = pool[choice]
            worker.policy.on_request(tags, at)
            served = Served(index, workflow, choice, at, enc.prompt_len, max(1, len(enc.tokens) - enc.prompt_len))
            worker.enqueue(served, enc, tags)
            if on_request is not None:
                on_request()
        for worker in pool:
            if worker.busy_until <= now and not worker.idle:
                # finished requests, and requests refused at admission (their workflows go on without them)
                for served in worker.step(now):
                    release(served.workflow, served.finished)
                    if on_finish is not None:
                        on_finish(served)
        upcoming = [w.busy_until for w in pool if not w.idle and w.busy_until > now]
        if due:
            upcoming.append(due[0][0])
        if hints_due:
            upcoming.append(hints_due[0][0])
        if not upcoming:
            break
        now = min(upcoming)
    result = ServingResult(spec.text, capacity, workers)
    result.served = sorted((s for w in pool for s in w.served), key=lambda s: s.index)
    result.evicted_tokens = [dict(w.cache.component.evicted_tokens) for w in pool]
    result.busy_s = [w.busy_s for w in pool]
    result.active_workflows = [len(w.policy.registry) for w in pool]
    result.after_tool = calls_after_tools(prepared.trace.events)
    return result
