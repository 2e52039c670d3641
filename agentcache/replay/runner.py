"""Replay a trace through SGLang's real radix cache, once per policy, and measure each run.

All policies see the same token encoding of the same trace; every number of a
run is set beside LRU (what users have today) and Belady (the offline optimum)
as the share of the gap between them that the policy closes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import POLICIES, PolicyConfigError, RequestTags, WorkflowRegistry, make_policy, parse_ingredients
from agentcache.policy.lru import LRUPolicy
from agentcache.replay.engine import BUILTIN_STRATEGIES, ReplayCache
from agentcache.replay.tokens import EncodedRequest, NextUseIndex, TokenCodec
from agentcache.trace import End, Request, Trace

TIMELINE_POINTS = 40


def known_policies() -> tuple[str, ...]:
    return (*POLICIES, *(b for b in BUILTIN_STRATEGIES if b not in POLICIES))


def parse_policies(spec: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise PolicyConfigError("no policy given")
    known = known_policies()
    for name in names:
        if name.startswith("pbkv/"):
            parse_ingredients(name)
        elif name not in known:
            raise PolicyConfigError(f"unknown policy {name!r}; choose from {', '.join(known)}")
    return list(dict.fromkeys(names))


@dataclass
class ReplayResult:
    policy: str
    capacity: int
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    recomputed_tokens: int = 0
    oversized_requests: int = 0
    modelled_latency_s: float = 0.0
    gap_closed: float | None = None
    evicted_tokens: dict[str, int] = field(default_factory=dict)
    replay_wall_s: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (ts, hit rate of the window ending there)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self, *, timeline: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out["hit_rate"] = self.hit_rate
        if not timeline:
            del out["timeline"]
        return out


class PreparedTrace:
    """A trace encoded once into token ids, shared by every policy's run."""

    def __init__(self, trace: Trace):
        self.trace = trace
        codec = TokenCodec()
        self.requests: list[Request] = trace.requests
        self.encoded: list[EncodedRequest] = [codec.encode(r, i) for i, r in enumerate(self.requests)]
        self.next_use = NextUseIndex(self.encoded)


def replay_policy(
    prepared: PreparedTrace,
    name: str,
    capacity: int,
    *,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
) -> ReplayResult:
    """Replay the whole trace with one policy (ours by name, or one of SGLang's built-ins)."""
    registry = WorkflowRegistry(lease_s=lease_s)
    current = 0  # index of the request being served, for the offline optimum's look-ahead

    def next_use(node: Any) -> float:
        return prepared.next_use.next_use(node.key.token_ids[0], current)

    builtin = name if name in BUILTIN_STRATEGIES and name not in POLICIES else None
    if builtin is not None:
        policy = LRUPolicy(registry)  # keeps tags for the statistics; SGLang's strategy orders eviction
    else:
        policy = make_policy(name, registry=registry, call_graph=prepared.trace.meta.call_graph, next_use=next_use)
    cache = ReplayCache(capacity, policy, builtin)
    result = ReplayResult(policy=name, capacity=capacity)
    window = max(1, len(prepared.requests) // TIMELINE_POINTS)
    window_prompt = window_hit = 0
    started = time.perf_counter()
    index = 0
    for event in prepared.trace.events:
        if isinstance(event, End):
            policy.on_end(event.workflow, event.ts)
            continue
        current = index
        enc = prepared.encoded[index]
        index += 1
        tags = RequestTags(event.workflow, event.agent, enc.fixed_len)
        policy.on_request(tags, event.ts)
        served = cache.serve(enc, tags, event.ts)
        hit = served.hit_tokens
        result.requests += 1
        result.prompt_tokens += enc.prompt_len
        result.hit_tokens += hit
        result.recomputed_tokens += enc.prompt_len - hit
        result.oversized_requests += not served.admitted
        result.modelled_latency_s += cost.request_s(enc.prompt_len, hit, 0, event.output)
        window_prompt += enc.prompt_len
        window_hit += hit
        if result.requests % window == 0:
            result.timeline.append((event.ts, window_hit / window_prompt))
            window_prompt = window_hit = 0
        if on_request is not None:
            on_request()
    result.replay_wall_s = time.perf_counter() - started
    result.evicted_tokens = dict(cache.component.evicted_tokens)
    return result


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
    policies: Sequence[str],
    capacities: Sequence[int],
    *,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
) -> list[ReplayResult]:
    prepared = PreparedTrace(trace)
    results = [
        replay_policy(prepared, name, capacity, cost=cost, lease_s=lease_s, on_request=on_request)
        for capacity in capacities
        for name in policies
    ]
    fill_gap_closed(results)
    return results
