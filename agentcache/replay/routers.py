"""The routers of the scale-out replay (:mod:`agentcache.replay.scale_out`): each a model of an sglang-router
0.3.2 policy, or of the client's workflow-aware routing through the router's ``manual`` policy, that chooses a
request's worker as it arrives and counts what it sent and has not seen answered. sglang-router's
``cache_aware`` has its own module (:mod:`agentcache.replay.cache_aware`).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import Counter
from collections.abc import Sequence

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.replay.scheduler import Served, Worker
from agentcache.replay.tokens import EncodedRequest
from agentcache.routing import DEFAULT_MAX_IMBALANCE, Placement, WorkflowAwareRouting
from agentcache.trace import Request


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
    worker before it serves (server_ext/router.py, ``Cluster.start``).
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
