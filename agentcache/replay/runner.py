"""Replay a trace through SGLang's real radix cache, once per policy, and measure each run.

All policies see the same token encoding of the same trace; every number of a
run is set beside LRU (what users have today) and the offline reference (Belady's farthest-next-use rule)
as the share of the gap between them that the policy closes.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import CachePolicy, PolicySpec, WorkflowRegistry, make_policy, prefetch
from agentcache.policy.spec import WARMUP
from agentcache.predictor import Predictor
from agentcache.replay.engine import ReplayCache, SGLangAloneCache
from agentcache.replay.results import UNLIMITED, ReplayResult
from agentcache.replay.tokens import EncodedRequest, NextUseIndex, TokenCodec
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace import AgentDone, End, Next, Request, ToolEnd, ToolEvent, ToolStart, Trace

TIMELINE_POINTS = 40


def as_spec(policy: PolicySpec | str) -> PolicySpec:
    return policy if isinstance(policy, PolicySpec) else PolicySpec.parse(policy)


# What a trace says beside its requests and ends: the client's hints, heard by the policy at their times.
HINTS = (ToolStart, ToolEnd, Next, AgentDone)
Hint = ToolEvent | Next | AgentDone


def request_tags(request: Request, enc: EncodedRequest) -> Tags:
    """A trace request's tags, as the server would hand them to the policy (the trace's agent is its identity)."""
    return Tags(workflow=request.workflow, agent=request.agent, fixed_tokens=enc.fixed_len, app=request.app)


def hear_hint(policy: CachePolicy, event: Hint, now: float) -> None:
    """An agent's tool call began or ended, or the app's framework decided who calls next or that an agent's
    context is done: the policy hears it at `now`, as the server hears the client's."""
    key = WorkflowKey("", event.workflow)
    if isinstance(event, Next):
        policy.on_next(key, event.agents, now)
    elif isinstance(event, AgentDone):
        policy.on_agent_done(key, event.agent, now)
    elif isinstance(event, ToolStart):
        policy.on_tool_start(key, event.agent, event.tool, now)
    else:
        policy.on_tool_end(key, event.agent, event.tool, now)


def tell_plan(policy: CachePolicy, trace: Trace) -> None:
    """The trace's plan, told at the start under the app its first request names (no app: the default one, "")."""
    plan = trace.meta.plan
    if plan is not None:
        first = next((e for e in trace.events if isinstance(e, Request)), None)
        policy.on_plan(first.app or "" if first is not None else "", plan, 0.0)


class PreparedTrace:
    """A trace encoded once into token ids, shared by every policy's run."""

    def __init__(self, trace: Trace):
        self.trace = trace
        codec = TokenCodec()
        self.requests: list[Request] = trace.requests
        self.encoded: list[EncodedRequest] = [codec.encode(r, i) for i, r in enumerate(self.requests)]
        self.next_use = NextUseIndex(self.encoded)

    def next_reads(self) -> list[int]:
        """Per request, how many tokens of its path (prompt, then output) the next request of the same agent in
        the same workflow reads as its prompt's prefix (0 where none follows): what an oracle can tell pbkv."""
        reads = [0] * len(self.encoded)
        latest: dict[tuple[str, str], int] = {}
        for index, request in enumerate(self.requests):
            pair = (request.workflow, request.agent)
            earlier = latest.get(pair)
            if earlier is not None:
                reads[earlier] = _common_prefix(
                    self.encoded[earlier].tokens, self.encoded[index].tokens, self.encoded[index].prompt_len
                )
            latest[pair] = index
        return reads


def _common_prefix(a: array, b: array, limit: int) -> int:
    """Length of the longest common prefix of `a` and `b[:limit]` (slices compare in C: a binary search)."""
    low, high = 0, min(len(a), len(b), limit)
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


def build_replay_cache(
    prepared: PreparedTrace,
    spec: PolicySpec,
    capacity: int,
    host_capacity: int,
    predictor: Predictor | None,
    registry: WorkflowRegistry,
    next_use: Callable[[Any], float],
) -> ReplayCache:
    """The cache a policy asks for: ours ordering eviction, or SGLang's built-in with ours keeping tags."""
    policy = make_policy(
        spec, registry=registry, call_graph=prepared.trace.meta.call_graph, predictor=predictor, next_use=next_use
    )
    return ReplayCache(capacity, policy, spec.strategy if spec.builtin else None, host_capacity, sessions=spec.sessions)


def replay_policy(
    prepared: PreparedTrace,
    policy_spec: PolicySpec | str,
    capacity: int,
    *,
    host_capacity: int = 0,
    predictor: Predictor | None = None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
    told_reads: bool = False,
) -> ReplayResult:
    """Replay the whole trace with one policy (ours by name, or one of SGLang's built-ins).

    `told_reads`: tell the policy, with each request, how much of its path the agent's next request in the
    workflow reads again (read from the trace, `PreparedTrace.next_reads`; pbkv values each latest path by it
    instead of its learned shares): with `--predictor oracle`, how far pbkv gets knowing what the trace's
    coins decide.
    """
    registry = WorkflowRegistry(lease_s=lease_s)
    current = 0  # index of the request being served, for the offline reference's look-ahead

    def next_use(node: Any) -> float:
        return prepared.next_use.next_use(node.key.token_ids[0], current)

    spec = as_spec(policy_spec)
    cache = build_replay_cache(prepared, spec, capacity, host_capacity, predictor, registry, next_use)
    policy = cache.policy
    mode = spec.prefetch
    result = ReplayResult(policy=spec.text, capacity=capacity, host_capacity=host_capacity)
    last_ts = 0.0
    window = max(1, len(prepared.requests) // TIMELINE_POINTS)
    window_prompt = window_hit = 0
    started = time.perf_counter()
    index = 0
    reads = prepared.next_reads() if told_reads else None
    tell_plan(policy, prepared.trace)
    for event in prepared.trace.events:
        if isinstance(event, End):
            cache.end_workflow(event.workflow, event.ts)
            continue
        if isinstance(event, HINTS):
            hear_hint(policy, event, event.ts)
            continue
        current = index
        enc = prepared.encoded[index]
        index += 1
        if mode is not None:  # before the request is known: the forecasts see only the past
            result.prefetched_tokens += prefetch_step(cache, policy, mode, event.ts - last_ts, event.ts, cost)
        last_ts = event.ts
        tags = request_tags(event, enc)
        if reads is not None:
            policy.told_reread = reads[current]
        policy.on_request(tags, event.ts)
        served = cache.serve(enc, tags, event.ts)
        if reads is not None:  # told of this request alone (not of the warm-ups a prefetch sends before the next)
            policy.told_reread = -1
        if mode is not None:  # warm-ups re-send fixed prompts
            cache.remember_fixed_prompt(event.agent, enc)
        hit = served.hit_tokens
        result.requests += 1
        result.prompt_tokens += enc.prompt_len
        result.hit_tokens += hit
        result.host_hit_tokens += served.loaded_tokens
        result.prefetch_used_tokens += served.prefetched_tokens
        result.recomputed_tokens += enc.prompt_len - hit - served.loaded_tokens
        result.oversized_requests += not served.admitted
        result.modelled_latency_s += cost.request_s(enc.prompt_len, hit, served.loaded_tokens, event.output)
        window_prompt += enc.prompt_len
        window_hit += hit
        if result.requests % window == 0:
            result.timeline.append((event.ts, window_hit / window_prompt))
            window_prompt = window_hit = 0
        if on_request is not None:
            on_request()
    result.replay_wall_s = time.perf_counter() - started
    result.evicted_tokens = dict(cache.component.evicted_tokens)
    result.prefetch_wasted_tokens = cache.component.prefetch_wasted_tokens
    return result


def replay_sglang_alone(
    prepared: PreparedTrace,
    builtin: str,
    capacity: int,
    cost: CostModel = DEFAULT_COST,
    *,
    on_request: Callable[[], None] | None = None,
) -> ReplayResult:
    """Replay the trace's requests through SGLang's cache with no agentcache (`SGLangAloneCache`): what a user
    runs with `--radix-eviction-policy builtin`. End events mean nothing to it. `on_request`: called after each
    request, as by `replay_policy`."""
    cache = SGLangAloneCache(capacity, builtin)
    result = ReplayResult(policy=f"{builtin} (SGLang alone, {cache.tree_core})", capacity=capacity)
    started = time.perf_counter()
    for request, enc in zip(prepared.requests, prepared.encoded):
        hit = cache.serve(enc)
        result.requests += 1
        result.prompt_tokens += enc.prompt_len
        result.hit_tokens += hit or 0
        result.recomputed_tokens += enc.prompt_len - (hit or 0)
        result.oversized_requests += hit is None
        result.modelled_latency_s += cost.request_s(enc.prompt_len, hit or 0, 0, request.output)
        if on_request is not None:
            on_request()
    result.replay_wall_s = time.perf_counter() - started
    return result


def prefetch_step(cache: ReplayCache, policy: Any, mode: str, idle_s: float, now: float, cost: CostModel) -> int:
    """Spend the idle time before the next request on loading (or warming) what the forecasts want next."""
    if mode == WARMUP:
        # No host tier: recompute fixed prompts with 1-token requests, in idle compute time.
        left = prefetch.budget(
            prefetch.CONSERVATIVE, cache.allocator.available_size(), cache.retired_tokens(), idle_s, 1.0 / cost.linear_s
        )
        warmed = 0
        for c in sorted(policy.prefetch_candidates(), key=lambda c: c.value, reverse=True):
            if c.fixed_agent is None or warmed >= left:
                continue
            warmed += cache.warm(c.fixed_agent, now, left - warmed)
        return warmed
    if not cache.host_tier:
        return 0
    retired = cache.retired_tokens() if mode == prefetch.CONSERVATIVE else 0
    return cache.prefetch(prefetch.budget(mode, cache.allocator.available_size(), retired, idle_s, 1.0 / cost.reload_s))


def fill_gap_closed(results: Sequence[ReplayResult]) -> None:
    """gap_closed = (hit - hit_lru) / (hit_belady - hit_lru), per capacity, when both ran."""
    by_capacity: dict[int, dict[str, ReplayResult]] = {}
    for r in results:
        by_capacity.setdefault(r.capacity, {})[r.policy] = r
    for runs in by_capacity.values():
        lru, belady = runs.get("lru"), runs.get("belady")
        if lru is None or belady is None:
            continue
        gap = belady.hit_rate - lru.hit_rate
        for r in runs.values():
            r.gap_closed = (r.hit_rate - lru.hit_rate) / gap if gap > 1e-12 else None


def replay(
    trace: Trace,
    policies: Sequence[PolicySpec | str],
    capacities: Sequence[int],
    *,
    host_capacity: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
    with_ceiling: bool = False,
    told_reads: bool = False,
) -> list[ReplayResult]:
    """Every policy at every capacity (capacity by capacity), each with its share of the LRU-to-offline gap;
    `with_ceiling`: the unlimited cache's row after each capacity's; `told_reads`: as `replay_policy`'s."""
    prepared = PreparedTrace(trace)
    specs = [as_spec(p) for p in policies]
    results = [
        replay_policy(
            prepared,
            spec,
            capacity,
            host_capacity=host_capacity,
            predictor=predictor_factory(),
            cost=cost,
            lease_s=lease_s,
            on_request=on_request,
            told_reads=told_reads,
        )
        for capacity in capacities
        for spec in specs
    ]
    fill_gap_closed(results)
    if not with_ceiling:
        return results
    top = ceiling(prepared, capacities, on_request=on_request)
    return [
        r
        for capacity, unlimited in zip(capacities, top)
        for r in (*(result for result in results if result.capacity == capacity), unlimited)
    ]


def ceiling(
    prepared: PreparedTrace, capacities: Sequence[int], on_request: Callable[[], None] | None = None
) -> list[ReplayResult]:
    """What no eviction at all would hit (the unlimited cache): one replay, one row per capacity, no gap closed."""
    everything = max(2, sum(len(enc.tokens) for enc in prepared.encoded))
    unlimited = replay_policy(prepared, "lru", everything, on_request=on_request)
    return [replace(unlimited, policy=UNLIMITED, capacity=capacity) for capacity in capacities]
