"""Workflow registry: which workflows are active, where each one is, and which have retired.

A workflow is active from its first request until its end event, or until its
lease runs out: apps crash and forget to end workflows, and a cache that
trusted them forever would pin memory forever. The lease counts from the
workflow's last activity (a request's arrival or its release: finished or
aborted), and never runs out while one of its requests is in flight (queued or
running), however long a saturated server keeps it. A release can be lost (a
scheduler path that drops a request without telling the cache): a workflow
whose newest request arrived ``IN_FLIGHT_LEASES`` leases ago counts as holding
none, so no lost release pins it for longer. A tool event is activity, and an open
tool pause counts as activity up to its cut-off (``hold``), never longer: a hung
tool does not pin its workflow.
Only active workflows are kept, so the registry stays bounded; an id it does
not know counts as retired, which is all a node's bookkeeping needs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice

from agentcache.tags import WorkflowKey, principal_of

# How long a request in flight holds its workflow at most, in leases from the workflow's newest arrival: long
# past any queueing a working server has (the timed replay's worst p90 TTFT is 177 s, the default lease 300 s).
IN_FLIGHT_LEASES = 8


@dataclass(slots=True)
class WorkflowState:
    id: WorkflowKey
    started: float
    last_seen: float
    path: list[str] = field(default_factory=list)  # agents called so far, in order
    in_flight: int = 0  # its requests that arrived and were not released yet (finished or aborted)
    last_active: float = 0.0  # its last arrival, release or tool event: where its lease counts from
    # Until when an open tool pause counts as its activity (the pause's cut-off; agentcache.policy.pauses).
    held_until: float = 0.0
    # The active workflows of its tenant's principal (itself included), least recent request first.
    peers: OrderedDict[WorkflowKey, None] | None = field(default=None, compare=False, repr=False)

    @property
    def agent(self) -> str | None:
        """The agent of the workflow's latest request."""
        return self.path[-1] if self.path else None


class WorkflowRegistry:
    """Active workflows, ordered by last request; lease expiry is cheap by the orders of `_idle` and `_held`."""

    def __init__(
        self,
        lease_s: float = 300.0,
        max_active: int = 100_000,
        max_path: int = 256,
        max_active_per_tenant: int | None = None,
    ):
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.lease_s = lease_s
        self.max_active = max_active
        # A keyed tenant's own cap (the operator's workflows have the server's alone). At the server's cap the
        # tenant holding the most loses its least recent: no tenant's flood of new ids retires another's.
        self.max_active_per_tenant = max_active_per_tenant
        self._of_principal: dict[str, OrderedDict[WorkflowKey, None]] = {}
        self.max_path = max_path
        self.held_s = lease_s * IN_FLIGHT_LEASES
        self.by_id: OrderedDict[WorkflowKey, WorkflowState] = OrderedDict()  # the active ones, least recent first
        # The policies ask these for every node they rank: the dict's own methods, no Python frame per call.
        self.is_active: Callable[[WorkflowKey], bool] = self.by_id.__contains__
        self.get: Callable[[WorkflowKey], WorkflowState | None] = self.by_id.get
        # Each active workflow is in one of these: with nothing in flight, by last activity (its lease runs
        # out from the front); holding requests, by newest arrival (the bound on a lost release, from the front).
        self._idle: OrderedDict[WorkflowKey, WorkflowState] = OrderedDict()
        self._held: OrderedDict[WorkflowKey, WorkflowState] = OrderedDict()
        self.retired_count = 0
        self.expired_count = 0
        self.lost_releases = 0  # requests taken as released when their workflow's hold ran out
        self.version = 0  # bumped on every change that can move a forecast

    # -- events

    def observe(self, workflow: WorkflowKey, agent: str, now: float) -> tuple[WorkflowState, str | None]:
        """Record a request of `workflow` by `agent`; returns the state and the previous agent."""
        state = self.by_id.get(workflow)
        if state is None:
            peers = self._room_for(principal_of(workflow.tenant))
            state = WorkflowState(workflow, started=now, last_seen=now, last_active=now, peers=peers)
            self.by_id[workflow] = state
            peers[workflow] = None
        else:
            self.by_id.move_to_end(workflow)
            if state.peers is not None:
                state.peers.move_to_end(workflow)
            if state.in_flight:
                del self._held[workflow]
            else:
                del self._idle[workflow]
        self._held[workflow] = state  # last: its newest arrival
        state.in_flight += 1
        previous = state.agent
        state.last_seen = now
        if now > state.last_active:
            state.last_active = now
        state.path.append(agent)
        if len(state.path) > self.max_path:
            del state.path[: len(state.path) - self.max_path]
        self.version += 1
        return state, previous

    def release(self, workflow: WorkflowKey, now: float) -> bool:
        """A request of `workflow` finished or was aborted; False when none of its requests was in flight."""
        state = self.by_id.get(workflow)
        if state is None or not state.in_flight:
            return False
        state.in_flight -= 1
        if now > state.last_active:
            state.last_active = now
        if not state.in_flight:
            del self._held[workflow]
            self._idle[workflow] = state  # last: its latest activity
        return True

    def touch(self, workflow: WorkflowKey, now: float) -> None:
        """Something of `workflow` happened at `now` (a tool event): its lease counts from then."""
        state = self.by_id.get(workflow)
        if state is None or now <= state.last_active:
            return
        state.last_active = now
        if not state.in_flight:
            self._idle.move_to_end(workflow)  # last: its latest activity

    def hold(self, workflow: WorkflowKey, until: float) -> None:
        """The open tool pauses of `workflow` count as its activity until `until` (0.0: none is open)."""
        state = self.by_id.get(workflow)
        if state is not None:
            state.held_until = until

    def _paused(self, state: WorkflowState, now: float) -> bool:
        """Whether an open pause keeps the lease of `state` (run out by its last activity) from running out by
        `now`: the pause is activity up to its cut-off."""
        if state.held_until <= state.last_active:
            return False
        state.last_active = min(state.held_until, now)
        return now - state.last_active < self.lease_s

    def end(self, workflow: WorkflowKey) -> WorkflowState | None:
        """Retire `workflow`; returns its last state, or None when it was not active."""
        return self._retire(workflow, expired=False)

    def expire(self, now: float) -> list[WorkflowState]:
        """Retire every workflow whose lease ran out; cheap when none did."""
        expired = []
        held, idle = self._held, self._idle
        while held:
            state = next(iter(held.values()))
            if now - state.last_seen < self.held_s:
                break
            # Its newest request arrived IN_FLIGHT_LEASES leases ago: the releases still owed are lost.
            self.lost_releases += state.in_flight
            state.in_flight = 0
            del held[state.id]
            idle[state.id] = state
            # Else it waits behind more recent ones: by under a lease.
            if now - state.last_active >= self.lease_s and not self._paused(state, now):
                self._retire(state.id, expired=True)
                expired.append(state)
        while idle:
            state = next(iter(idle.values()))
            if now - state.last_active < self.lease_s:
                break
            if self._paused(state, now):  # behind more recent ones: it retires by under a lease late at most
                idle.move_to_end(state.id)
                continue
            self._retire(state.id, expired=True)
            expired.append(state)
        return expired

    def _room_for(self, principal: str) -> OrderedDict[WorkflowKey, None]:
        """The active workflows of `principal`, with room for one more within its cap and the server's."""
        peers = self._of_principal.get(principal)
        if peers is None:
            peers = self._of_principal[principal] = OrderedDict()
        cap = self.max_active_per_tenant
        if principal and cap is not None and len(peers) >= cap:
            self._retire(next(iter(peers)), expired=True)
        elif len(self.by_id) >= self.max_active:
            largest = max(self._of_principal.values(), key=len)
            self._retire(next(iter(largest)), expired=True)
        return peers

    def _retire(self, workflow: WorkflowKey, *, expired: bool) -> WorkflowState | None:
        state = self.by_id.pop(workflow, None)
        if state is None:
            return None
        peers = state.peers
        if peers is not None:
            del peers[workflow]
        if state.in_flight:
            del self._held[workflow]
        else:
            del self._idle[workflow]
        self.retired_count += 1
        self.expired_count += expired
        self.version += 1
        return state

    # -- queries

    def active(self) -> Iterator[WorkflowState]:
        return iter(self.by_id.values())

    def recent(self, n: int) -> Iterator[WorkflowState]:
        """The `n` most recently active workflows, most recent first."""
        return islice(reversed(self.by_id.values()), n)

    def __len__(self) -> int:
        return len(self.by_id)
