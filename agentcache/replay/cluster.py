"""Several SGLang workers behind a router, in the timed replay: routings compared at equal total capacity.

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

import heapq
import itertools
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy import PolicyConfigError, PolicySpec
from agentcache.predictor import Predictor
from agentcache.replay.runner import PreparedTrace, as_spec
from agentcache.replay.serving import Served, ServingResult, Worker, serve_trace
from agentcache.replay.tokens import EncodedRequest
from agentcache.routing import DEFAULT_MAX_IMBALANCE, Placement, WorkflowAwareRouting
from agentcache.trace import Request, Trace

ROUTINGS = ("round-robin", "power-of-two", "cache-aware", "workflow-affinity", "workflow-aware")

# sglang-router 0.3.2's defaults (sglang_router/router_args.py).
CACHE_THRESHOLD = 0.3
BALANCE_ABS_THRESHOLD = 64
BALANCE_REL_THRESHOLD = 1.5
EVICTION_INTERVAL_S = 60.0
MAX_TREE_CHARS = 2**26
CHARS_PER_TOKEN = 4  # the router's tree counts characters; the trace counts tokens


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


# ---------------------------------------------------------------- routers


class InFlight:
    """A router's load per worker: requests it sent there whose answer has not come back yet, and the routing
    keys those requests carry (sglang-router's ``WorkerRoutingKeyLoad``: what ``min_group`` counts)."""

    def __init__(self, workers: int):
        self.load = [0] * workers
        self.keys: list[Counter[str]] = [Counter() for _ in range(workers)]  # per worker: key -> requests in flight
        self._answers: list[tuple[float, int, int, str | None]] = []  # (answered at, order, worker, routing key)
        self._order = itertools.count()

    def sent(self, worker: int, key: str | None = None) -> None:
        self.load[worker] += 1
        if key is not None:
            self.keys[worker][key] += 1

    def answered(self, served: Served, key: str | None = None) -> None:
        """`served` (sent with routing `key`) will be answered at `served.finished` (the replay knows it when its
        last step starts)."""
        heapq.heappush(self._answers, (served.finished, next(self._order), served.worker, key))

    def advance(self, now: float) -> None:
        while self._answers and self._answers[0][0] <= now:
            _, _, worker, key = heapq.heappop(self._answers)
            self.load[worker] -= 1
            if key is not None:
                keys = self.keys[worker]
                keys[key] -= 1
                if not keys[key]:
                    del keys[key]

    def least_loaded(self) -> int:
        return min(range(len(self.load)), key=self.load.__getitem__)


class ModelledRouter:
    """A router in the timed replay: `serve_trace`'s router, `on_finish` and `on_end` in one object."""

    def __init__(self, workers: int):
        self.workers = workers
        self.in_flight = InFlight(workers)

    def __call__(self, request: Request, enc: EncodedRequest, _pool: Sequence[Worker], now: float) -> int:
        self.in_flight.advance(now)
        worker = self.choose(request, enc, now)
        self.in_flight.sent(worker, self.routing_key(request))
        return worker

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        raise NotImplementedError

    def routing_key(self, request: Request) -> str | None:
        """The routing key the router counts `request` under while it is in flight (None: none)."""
        return None

    def on_finish(self, served: Served) -> None:
        self.in_flight.answered(served)

    def on_end(self, workflow: str, at: float) -> None:
        pass


class RoundRobin(ModelledRouter):
    def __init__(self, workers: int):
        super().__init__(workers)
        self._next = 0

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        worker, self._next = self._next, (self._next + 1) % self.workers
        return worker


class PowerOfTwo(ModelledRouter):
    """Two distinct workers at random; the one with fewer requests in flight (the first drawn on a tie)."""

    def __init__(self, workers: int, seed: int = 0):
        super().__init__(workers)
        self._rng = random.Random(seed)

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        if self.workers == 1:
            return 0
        a, b = self._rng.sample(range(self.workers), 2)
        return b if self.in_flight.load[b] < self.in_flight.load[a] else a


@dataclass
class _TreeNode:
    parent: int  # the chain before this one; 0 at the root
    tokens: int
    tenants: dict[int, float] = field(default_factory=dict)  # worker -> last access (insertion order kept)
    children: dict[int, int] = field(default_factory=dict)  # worker -> children holding it


class ApproximateTree:
    """sglang-router's approximate radix tree: what the router sent to which worker (its tenants).

    The router's tree is over the request's characters; here nodes are the
    prompt's segments in context (the codec's chains), which is the same tree
    where prompts differ only at segment boundaries. Sizes are tokens per tenant.
    """

    def __init__(self, workers: int, max_tokens: int = MAX_TREE_CHARS // CHARS_PER_TOKEN):
        self.max_tokens = max_tokens
        self.nodes: dict[int, _TreeNode] = {}
        self.size = [0] * workers

    def match(self, chains: Sequence[int], lengths: Sequence[int], now: float) -> tuple[int, int | None]:
        """Tokens of the longest prefix in the tree and a worker holding it (the earliest still there)."""
        matched, last = 0, None
        for chain, length in zip(chains, lengths):
            node = self.nodes.get(chain)
            if node is None or not node.tenants:
                break
            matched, last = matched + length, node
        if last is None:
            return 0, None
        tenant = next(iter(last.tenants))
        last.tenants[tenant] = now
        return matched, tenant

    def insert(self, chains: Sequence[int], lengths: Sequence[int], tenant: int, now: float) -> None:
        parent = 0
        for chain, length in zip(chains, lengths):
            node = self.nodes.get(chain)
            if node is None:
                node = self.nodes[chain] = _TreeNode(parent, length)
            if tenant not in node.tenants:
                self.size[tenant] += length
                if parent:
                    above = self.nodes[parent].children
                    above[tenant] = above.get(tenant, 0) + 1
            node.tenants[tenant] = now
            parent = chain

    def smallest_tenant(self) -> int:
        return min(range(len(self.size)), key=self.size.__getitem__)

    def evict(self) -> None:
        """Each worker over `max_tokens` loses its least recently used leaves until it fits (the router's timer)."""
        over = {t for t, size in enumerate(self.size) if size > self.max_tokens}
        if not over:
            return
        leaves = [
            (node.tenants[t], chain, t)
            for chain, node in self.nodes.items()
            for t in over
            if t in node.tenants and not node.children.get(t)
        ]
        heapq.heapify(leaves)
        while leaves:
            _, chain, tenant = heapq.heappop(leaves)
            if self.size[tenant] <= self.max_tokens:
                continue
            node = self.nodes[chain]
            del node.tenants[tenant]
            self.size[tenant] -= node.tokens
            if not node.tenants and not node.children:
                del self.nodes[chain]
            if node.parent:
                parent = self.nodes[node.parent]
                parent.children[tenant] -= 1
                if not parent.children[tenant]:
                    del parent.children[tenant]
                    heapq.heappush(leaves, (parent.tenants[tenant], node.parent, tenant))


class CacheAware(ModelledRouter):
    """sglang-router 0.3.2's ``cache_aware`` policy, with its defaults."""

    def __init__(
        self,
        workers: int,
        *,
        cache_threshold: float = CACHE_THRESHOLD,
        balance_abs_threshold: int = BALANCE_ABS_THRESHOLD,
        balance_rel_threshold: float = BALANCE_REL_THRESHOLD,
        eviction_interval_s: float = EVICTION_INTERVAL_S,
        max_tree_tokens: int = MAX_TREE_CHARS // CHARS_PER_TOKEN,
    ):
        super().__init__(workers)
        self.tree = ApproximateTree(workers, max_tree_tokens)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold = balance_abs_threshold
        self.balance_rel_threshold = balance_rel_threshold
        self.eviction_interval_s = eviction_interval_s
        self._next_eviction = eviction_interval_s

    def imbalanced(self) -> bool:
        low, high = min(self.in_flight.load), max(self.in_flight.load)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        while now >= self._next_eviction:
            self.tree.evict()
            self._next_eviction += self.eviction_interval_s
        lengths = [s.tokens for s in request.segments]
        if self.imbalanced():
            choice = self.in_flight.least_loaded()
        else:
            matched, tenant = self.tree.match(enc.prompt_chains, lengths, now)
            rate = matched / enc.prompt_len if enc.prompt_len else 0.0
            choice = tenant if tenant is not None and rate > self.cache_threshold else self.tree.smallest_tenant()
        self.tree.insert(enc.prompt_chains, lengths, choice, now)
        return choice


class ManualPolicy:
    """sglang-router 0.3.2's ``manual`` policy with ``--assignment-mode min_group``: a routing key keeps its
    worker; a new key goes to a worker with the fewest routing keys in flight (``min_group_select`` over
    ``WorkerRoutingKeyLoad``: a key counts while a request with it is unanswered), drawn at random among
    the tied. Keys outlive their workflows (the router drops them only after ``--max-idle-secs``, 4 h)."""

    def __init__(self, in_flight: InFlight, seed: int = 0):
        self.in_flight = in_flight
        self.worker_of: dict[str, int] = {}
        self._rng = random.Random(seed)

    def route(self, key: str) -> int:
        worker = self.worker_of.get(key)
        if worker is None:
            counts = [len(keys) for keys in self.in_flight.keys]
            fewest = min(counts)
            worker = self._rng.choice([w for w, count in enumerate(counts) if count == fewest])
            self.worker_of[key] = worker
        return worker


class WorkflowAffinity(ModelledRouter):
    """The manual policy keyed by the workflow id (``AGENTCACHE_ROUTING=workflow-affinity``)."""

    def __init__(self, workers: int):
        super().__init__(workers)
        self.manual = ManualPolicy(self.in_flight)

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        return self.manual.route(request.workflow)

    def routing_key(self, request: Request) -> str | None:
        return request.workflow

    def on_finish(self, served: Served) -> None:
        self.in_flight.answered(served, served.workflow)


class WorkflowAware(ModelledRouter):
    """The client's WorkflowAwareRouting picks a slot; its key goes through the manual policy.

    The client hears an answer, and its output length, when it arrives (at the request's finish); a workflow
    has at most one request in flight (the replay sends its next one after the answer), so placements are kept
    per workflow. Slot i's key is on worker i: ``agentcache serve --workers N`` places the slot keys one per
    worker before it serves (server_ext/cluster.py, ``Cluster.start``).
    """

    def __init__(
        self,
        workers: int,
        *,
        max_imbalance: float = DEFAULT_MAX_IMBALANCE,
        cost: CostModel = DEFAULT_COST,
    ):
        super().__init__(workers)
        self.client = WorkflowAwareRouting(workers, max_imbalance=max_imbalance, cost=cost)
        self._pending: dict[str, Placement] = {}  # workflow -> its request in flight
        self._answers: list[tuple[float, int, str, int | None]] = []  # (answered at, order, workflow, output tokens)
        self._order = itertools.count()

    def choose(self, request: Request, enc: EncodedRequest, now: float) -> int:
        self._hear_answers(now)
        placement = self.client.choose(
            request.workflow, request.agent, enc.prompt_len, enc.fixed_len, conversation_of(request)
        )
        self._pending[request.workflow] = placement
        return placement.slot

    def on_finish(self, served: Served) -> None:
        super().on_finish(served)
        output_tokens = served.output_tokens if served.admitted else None  # a refused request: an error, no usage
        heapq.heappush(self._answers, (served.finished, next(self._order), served.workflow, output_tokens))

    def on_end(self, workflow: str, at: float) -> None:
        self._hear_answers(at)
        self.client.ended(workflow)

    def _hear_answers(self, now: float) -> None:
        while self._answers and self._answers[0][0] <= now:
            _, _, workflow, output_tokens = heapq.heappop(self._answers)
            self.client.answered(self._pending.pop(workflow), output_tokens)


def conversation_of(request: Request) -> str | None:
    """The thread a prompt continues: its first segment after the fixed prompt (None when it has none)."""
    return request.segments[request.fixed].content_id if request.fixed < len(request.segments) else None


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


# ---------------------------------------------------------------- runs


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
