"""Scale-out in the timed replay: several SGLang workers behind a router, routings compared at equal total
capacity.

Scale-out splits one cache into N: whether a request's prefix is cached now
depends on which worker it lands on, and how long it waits depends on how
many requests went there before it. The trace is served by the timed replay
(:func:`agentcache.replay.serving.serve_trace`: each worker is SGLang's real
radix cache with the policy, under a model of its scheduler, on one clock),
and a router chooses each request's worker as it arrives. Routings:

- ``round-robin``: request i to worker i mod N (sglang-router ``round_robin``).
- ``power-of-two``: two distinct workers drawn at random, the one with fewer
  requests in flight (sglang-router ``power_of_two``).
- ``cache-aware``: sglang-router 0.3.2's ``cache_aware`` with its defaults
  (:class:`CacheAware`): an approximate prefix tree of what it sent where;
  when the in-flight loads are imbalanced (max - min > 64 and max > 1.5 x
  min) the least-loaded worker; else the worker of the longest match if it
  covers more than 30% of the prompt, else the worker with the smallest tree.
- ``workflow-affinity``: the router's ``manual`` policy keyed by the workflow
  id (``--assignment-mode min_group``): a workflow's requests all go where its
  first went, a new workflow to the worker with the fewest routing keys in
  flight (ties at random), as sglang-router 0.3.2 places it.
- ``workflow-aware``: the client routes (:mod:`agentcache.routing`): each
  request to the slot with the largest expected saved prefill, within a
  bound on imbalance of requests in flight, sent as the routing key of
  that slot through the same ``manual`` policy, which holds slot i on worker
  i (``agentcache serve --workers N`` places the slot keys one per worker
  before serving).

A router's load is what sglang-router counts: requests it sent to a worker
and has not seen answered. End events go to every worker that served the
workflow (``serve_trace`` does that). Belady's look-ahead is over the whole
trace, not per worker, so in a cluster it is a heuristic, not a bound.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import PolicyConfigError, PolicySpec
from agentcache.predictor import Predictor
from agentcache.replay.cache_aware import CacheAware
from agentcache.replay.routers import ModelledRouter, PowerOfTwo, RoundRobin, WorkflowAffinity, WorkflowAware
from agentcache.replay.runner import PreparedTrace, as_spec
from agentcache.replay.serving import ServingResult, serve_trace
from agentcache.trace import Trace

ROUTINGS = ("round-robin", "power-of-two", "cache-aware", "workflow-affinity", "workflow-aware")


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


def make_router(routing: str, workers: int, cost: CostModel = DEFAULT_COST) -> ModelledRouter:
    if routing == "round-robin":
        return RoundRobin(workers)
    if routing == "power-of-two":
        return PowerOfTwo(workers)
    if routing == "cache-aware":
        return CacheAware(workers)
    if routing == "workflow-affinity":
        return WorkflowAffinity(workers)
    if routing == "workflow-aware":
        return WorkflowAware(workers, cost=cost)
    raise RoutingError(f"unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")


def _imbalance(loads: Sequence[int]) -> float:
    """max / mean: 1.0 is perfectly even; N means one worker did everything."""
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def replay_routing(
    prepared: PreparedTrace,
    policy: PolicySpec | str,
    instances: int,
    capacity: int,
    routing: str,
    *,
    time_scale: float = 1.0,
    max_running: int | None = None,
    host_capacity: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One timed run: the trace served by `instances` workers of `capacity` tokens, each request routed by `routing`."""
    spec = as_spec(policy)
    router = make_router(routing, instances, cost)
    started = time.perf_counter()
    result = serve_trace(
        prepared,
        spec,
        capacity,
        workers=instances,
        router=router,
        on_end=router.on_end,
        on_finish=router.on_finish,
        cost=cost,
        time_scale=time_scale,
        max_running=max_running,
        host_capacity=host_capacity,
        predictor_factory=predictor_factory,
        lease_s=lease_s,
        on_request=on_request,
    )
    return summarize(result, routing, time_scale, cost, time.perf_counter() - started)


def summarize(result: ServingResult, routing: str, time_scale: float, cost: CostModel, wall_s: float) -> dict[str, Any]:
    """A run's figures: today's untimed fields (hit rate, imbalance, split workflows) and the timed ones."""
    served_by: dict[str, set[int]] = {}
    for s in result.served:
        served_by.setdefault(s.workflow, set()).add(s.worker)
    total = result.summary()
    per = [result.summary(i) for i in range(result.workers)]
    done = [s for s in result.served if s.admitted]
    return {
        "routing": routing,
        "policy": result.policy,
        "instances": result.workers,
        "capacity_per_instance": result.capacity,
        "total_capacity": result.capacity * result.workers,
        "time_scale": time_scale,
        **total,
        "host_hit_tokens": sum(s.loaded_tokens for s in done),
        "modelled_latency_s": sum(
            cost.request_s(s.prompt_tokens, s.hit_tokens, s.loaded_tokens, s.output_tokens) for s in done
        ),
        "imbalance": _imbalance([p["prompt_tokens"] for p in per]),
        "request_imbalance": _imbalance([p["requests"] for p in per]),
        "workflows": len(served_by),
        "split_workflows": sum(len(w) > 1 for w in served_by.values()),
        "per_instance": [
            {
                "instance": i,
                **p,
                "evicted_tokens": result.evicted_tokens[i],
                "active_workflows": result.active_workflows[i],  # left at the end: never ended, lease not run out
            }
            for i, p in enumerate(per)
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
    time_scale: float = 1.0,
    max_running: int | None = None,
    host_capacity_per_instance: int = 0,
    predictor_factory: Callable[[], Predictor | None] = lambda: None,
    cost: CostModel = DEFAULT_COST,
    lease_s: float = 300.0,
    on_request: Callable[[], None] | None = None,
) -> list[dict[str, Any]]:
    """One summary per routing: the trace served by `instances` workers of `capacity_per_instance` tokens each.

    Each dict has `routing`, `hit_rate`, `ttft_p50_s`, `ttft_p90_s`, `throughput_rps`, `utilization`,
    `imbalance` (max/mean prompt tokens per worker), `request_imbalance`, `split_workflows` (workflows
    served by more than one worker) and `per_instance`. Arrival times are multiplied by `time_scale`
    (below 1: more load). Raises RoutingError for a bad routing or cluster shape, PolicyConfigError for
    a bad policy.
    """
    names = parse_routings(routings)
    if instances < 1:
        raise RoutingError(f"instances must be >= 1, got {instances}")
    if capacity_per_instance < 2:
        raise RoutingError(f"capacity per instance must be >= 2 tokens, got {capacity_per_instance}")
    if time_scale <= 0:
        raise RoutingError(f"time scale must be > 0, got {time_scale}")
    spec = as_spec(policy)
    if spec.prefetch is not None:
        raise PolicyConfigError(f"{spec.text}: prefetch variants are replayed on one instance only (untimed)")
    prepared = trace if isinstance(trace, PreparedTrace) else PreparedTrace(trace)
    return [
        replay_routing(
            prepared,
            spec,
            instances,
            capacity_per_instance,
            name,
            time_scale=time_scale,
            max_running=max_running,
            host_capacity=host_capacity_per_instance,
            predictor_factory=predictor_factory,
            cost=cost,
            lease_s=lease_s,
            on_request=on_request,
        )
        for name in names
    ]
