"""Replay a trace over several cache instances behind a router, to compare routings at equal total capacity.

Scale-out splits one cache into N: whether a workflow's history is still
cached now depends on which instance its next request lands on. Each instance
is a :class:`ReplayCache` (SGLang's real radix cache) with its own policy,
workflow registry and forecaster, fed exactly as ``replay_policy`` feeds one;
only the choice of instance is new. Routings:

- ``round-robin``: request i goes to instance i mod N (workflow-blind).
- ``prefix-aware``: the instance whose device cache holds the longest prefix
  of the prompt, probed with the tree core's read-only
  ``match_full_device_prefix`` (no node split, no access-time update: probing
  N caches changes none of them, and the probe equals the hit the request then
  gets); ties go to the instance with the fewest prompt tokens routed so far.
  Like sglang-router's ``cache_aware`` policy, without its load-balance
  thresholds and with the real cache contents instead of the router's
  approximate tree.
- ``workflow-affinity``: every request of a workflow goes where its first one
  went; a new workflow goes to the instance with the fewest active workflows
  (seen there, neither ended nor expired). That is sglang-router's ``--policy
  manual`` with the SDK's ``x-smg-routing-key``; the router itself places a
  new key at random or by its own counts (``--assignment-mode``), as it never
  hears of ends.

End events go to every instance that served the workflow. Belady's look-ahead
is over the whole trace, not per instance, so in a cluster it is a
heuristic, not a bound.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang.srt.mem_cache.radix_cache import RadixKey

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import PolicySpec, WorkflowRegistry
from agentcache.predictor import Predictor
from agentcache.replay.engine import ReplayCache
from agentcache.replay.runner import (
    PreparedTrace,
    ReplayResult,
    as_spec,
    build_replay_cache,
    prefetch_step,
    request_tags,
)
from agentcache.replay.tokens import EncodedRequest
from agentcache.tags import WorkflowKey
from agentcache.trace import End, Request, Trace

ROUTINGS = ("round-robin", "prefix-aware", "workflow-affinity")


class RoutingError(ValueError):
    """A bad routing name or cluster shape: the message says what is allowed."""


def parse_routings(routings: str | Sequence[str]) -> list[str]:
    """Routing names from a list or a comma-separated string, checked and de-duplicated."""
    names = routings.split(",") if isinstance(routings, str) else list(routings)
    names = [n.strip() for n in names if n.strip()]
    if not names:
        raise RoutingError(f"no routing given; choose from {', '.join(ROUTINGS)}")
    for name in names:
        if name not in ROUTINGS:
            raise RoutingError(f"unknown routing {name!r}; choose from {', '.join(ROUTINGS)}")
    return list(dict.fromkeys(names))


@dataclass
class Instance:
    """One cache of the cluster (with its own policy and workflow registry), and what it served."""

    cache: ReplayCache
    result: ReplayResult
    last_ts: float = 0.0  # time of its last request: the idle time before the next one is its prefetch budget

    @property
    def active_workflows(self) -> int:
        """Workflows seen here and neither ended nor expired, by this instance's own registry."""
        return len(self.cache.policy.registry)


class Cluster:
    """N instances replaying one prepared trace; `current` is the request being served (Belady's look-ahead)."""

    def __init__(
        self,
        prepared: PreparedTrace,
        policy: PolicySpec | str,
        instances: int,
        capacity: int,
        *,
        host_capacity: int = 0,
        predictor_factory: Callable[[], Predictor | None] = lambda: None,
        lease_s: float = 300.0,
    ):
        self.prepared = prepared
        self.current = 0
        spec = as_spec(policy)
        self.prefetch_mode = spec.prefetch
        self.instances = [
            self._instance(spec, capacity, host_capacity, predictor_factory(), lease_s) for _ in range(instances)
        ]

    def _instance(
        self, spec: PolicySpec, capacity: int, host_capacity: int, predictor: Predictor | None, lease_s: float
    ) -> Instance:
        cache = build_replay_cache(
            self.prepared, spec, capacity, host_capacity, predictor, WorkflowRegistry(lease_s=lease_s), self._next_use
        )
        return Instance(
            cache,
            ReplayResult(policy=spec.text, capacity=capacity, host_capacity=host_capacity),
        )

    def _next_use(self, node: Any) -> float:
        return self.prepared.next_use.next_use(node.key.token_ids[0], self.current)

    def serve(self, i: int, request: Request, enc: EncodedRequest, cost: CostModel) -> None:
        """replay_policy's per-request step, on instance `i`."""
        inst = self.instances[i]
        cache, policy, r = inst.cache, inst.cache.policy, inst.result
        if self.prefetch_mode is not None:
            r.prefetched_tokens += prefetch_step(
                cache, policy, self.prefetch_mode, request.ts - inst.last_ts, request.ts, cost
            )
        inst.last_ts = request.ts
        tags = request_tags(request, enc)
        policy.on_request(tags, request.ts)
        served = cache.serve(enc, tags, request.ts)
        cache.remember_fixed_prompt(request.agent, enc)
        r.requests += 1
        r.prompt_tokens += enc.prompt_len
        r.hit_tokens += served.hit_tokens
        r.host_hit_tokens += served.loaded_tokens
        r.prefetch_used_tokens += served.prefetched_tokens
        r.recomputed_tokens += enc.prompt_len - served.hit_tokens - served.loaded_tokens
        r.oversized_requests += not served.admitted
        r.modelled_latency_s += cost.request_s(enc.prompt_len, served.hit_tokens, served.loaded_tokens, request.output)


def cached_prefix(cache: ReplayCache, enc: EncodedRequest) -> int:
    """Prompt tokens the device cache would serve now (as the server matches: at most prompt-1), read-only."""
    key = RadixKey(array("q", enc.tokens[: enc.prompt_len - 1]))
    matched, _node, _pinned = cache.cache.tree_core.match_full_device_prefix(key)
    return matched


class Router:
    """Chooses an instance per request by one of ROUTINGS."""

    def __init__(self, routing: str, instances: Sequence[Instance]):
        if routing not in ROUTINGS:
            raise RoutingError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
        self.routing = routing
        self.instances = instances
        self._count = 0
        self._home: dict[str, int] = {}  # workflow -> its instance (workflow-affinity)

    def choose(self, request: Request, enc: EncodedRequest) -> int:
        n = len(self.instances)
        if self.routing == "round-robin":
            self._count += 1
            return (self._count - 1) % n
        if self.routing == "prefix-aware":
            return max(
                range(n),
                key=lambda i: (
                    cached_prefix(self.instances[i].cache, enc),
                    -self.instances[i].result.prompt_tokens,
                    -i,
                ),
            )
        home = self._home.get(request.workflow)
        if home is None:
            home = min(range(n), key=lambda i: (self.instances[i].active_workflows, i))
            self._home[request.workflow] = home
        return home

    def on_end(self, workflow: str) -> None:
        self._home.pop(workflow, None)


def _imbalance(loads: Sequence[int]) -> float:
    """max / mean: 1.0 is perfectly even; N means one instance did everything."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def replay_routing(
    prepared: PreparedTrace,
    policy: PolicySpec | str,
    instances: int,
    capacity: int,
    routing: str,
    *,
    host_capacity: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
) -> dict[str, Any]:
    """One run: the whole trace through `instances` caches, each request routed by `routing`."""
    policy = as_spec(policy)
    cluster = Cluster(
        prepared,
        policy,
        instances,
        capacity,
        host_capacity=host_capacity,
        predictor_factory=predictor_factory,
        lease_s=lease_s,
    )
    router = Router(routing, cluster.instances)
    served_by: dict[str, set[int]] = {}  # workflow -> the instances that served it (its end goes to each)
    started = time.perf_counter()
    index = 0
    for event in prepared.trace.events:
        if isinstance(event, End):
            for i in served_by.get(event.workflow, ()):
                cluster.instances[i].cache.policy.on_end(WorkflowKey("", event.workflow), event.ts)
            router.on_end(event.workflow)
            continue
        cluster.current = index
        enc = prepared.encoded[index]
        index += 1
        i = router.choose(event, enc)
        served_by.setdefault(event.workflow, set()).add(i)
        cluster.serve(i, event, enc, cost)
    wall_s = time.perf_counter() - started
    results = [inst.result for inst in cluster.instances]
    for inst in cluster.instances:
        inst.result.evicted_tokens = dict(inst.cache.component.evicted_tokens)
        inst.result.replay_wall_s = wall_s
    prompt = sum(r.prompt_tokens for r in results)
    hit = sum(r.hit_tokens for r in results)
    return {
        "routing": routing,
        "policy": policy.text,
        "instances": instances,
        "capacity_per_instance": capacity,
        "total_capacity": capacity * instances,
        "requests": sum(r.requests for r in results),
        "prompt_tokens": prompt,
        "hit_tokens": hit,
        "hit_rate": hit / prompt if prompt else 0.0,
        "host_hit_tokens": sum(r.host_hit_tokens for r in results),
        "modelled_latency_s": sum(r.modelled_latency_s for r in results),
        "oversized_requests": sum(r.oversized_requests for r in results),
        "imbalance": _imbalance([r.prompt_tokens for r in results]),
        "request_imbalance": _imbalance([r.requests for r in results]),
        "workflows": len(served_by),
        "split_workflows": sum(len(s) > 1 for s in served_by.values()),
        "per_instance": [
            {
                "instance": i,
                "requests": r.requests,
                "prompt_tokens": r.prompt_tokens,
                "hit_tokens": r.hit_tokens,
                "hit_rate": r.hit_rate,
                "host_hit_tokens": r.host_hit_tokens,
                "modelled_latency_s": r.modelled_latency_s,
                "oversized_requests": r.oversized_requests,
                "evicted_tokens": r.evicted_tokens,
                "active_workflows": inst.active_workflows,  # left at the end: never ended, lease not run out
            }
            for i, (inst, r) in enumerate(zip(cluster.instances, results))
        ],
        "replay_wall_s": wall_s,
    }


def replay_cluster(
    trace: Trace | PreparedTrace,
    policy: PolicySpec | str,
    instances: int,
    capacity_per_instance: int,
    routings: str | Sequence[str] = ROUTINGS,
    *,
    host_capacity_per_instance: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
) -> list[dict[str, Any]]:
    """One summary per routing: the trace over `instances` caches of `capacity_per_instance` tokens each.

    Each dict has `routing`, `hit_rate`, `imbalance` (max/mean prompt tokens per
    instance), `request_imbalance`, `split_workflows` (workflows served by more
    than one instance) and `per_instance` (requests, prompt_tokens, hit_rate, ...).
    Raises RoutingError for a bad routing or cluster shape, PolicyConfigError for a bad policy.
    """
    names = parse_routings(routings)
    if instances < 1:
        raise RoutingError(f"instances must be >= 1, got {instances}")
    if capacity_per_instance < 2:
        raise RoutingError(f"capacity per instance must be >= 2 tokens, got {capacity_per_instance}")
    spec = as_spec(policy)
    prepared = trace if isinstance(trace, PreparedTrace) else PreparedTrace(trace)
    return [
        replay_routing(
            prepared,
            spec,
            instances,
            capacity_per_instance,
            name,
            host_capacity=host_capacity_per_instance,
            predictor_factory=predictor_factory,
            cost=cost,
            lease_s=lease_s,
        )
        for name in names
    ]
