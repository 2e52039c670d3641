"""Tool pauses: which agents wait on a tool now, how long each agent's calls of each tool take, and the
hung-tool cut-off.

An agent whose answer asked for a tool waits while the framework runs it (tool_start), then calls again with
its prompt, its answer and the tool's result appended (after tool_end; a client that never sends tool_end ends
the pause with that call). While it waits, its path is the surest reuse there is: a policy may keep it (pbkv's
`tools` ingredient), and the workflow's lease counts the pause as activity. A pause that runs past its cut-off,
CUTOFF_P90_MULTIPLE times the p90 of the (agent, tool)'s learned durations, at least CUTOFF_FLOOR_S and at most
the ceiling, is cut off: from then on it protects nothing and holds no lease, as if it had never been heard. It
stays open, so that its end, if it ever comes, still teaches the tool's duration. Why these constants:
docs/design/policy.md.

Memory is bounded: pauses are kept for active workflows only (MAX_PAUSES_PER_WORKFLOW each, dropped with their
workflow), and duration models for MAX_TOOL_MODELS (agent, tool) pairs. Agents are identities scoped by their
key's holder (`Tags.identity`), so each tenant's agents learn their own durations.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from agentcache.policy.gaps import GapModel
from agentcache.policy.workflows import WorkflowRegistry
from agentcache.tags import WorkflowKey

MAX_TOOL_MODELS = 1024  # (agent, tool) pairs whose durations are kept, least recently learned dropped first
PER_TOOL_DURATIONS = 128  # recent durations kept per (agent, tool)
MIN_DURATIONS = 8  # fewer than this of a pair's own: it is taken to be like every tool (every pair's durations)
MAX_PAUSES_PER_WORKFLOW = 16  # open (agent, tool) pauses per workflow, and agents back from one; oldest dropped
CUTOFF_P90_MULTIPLE = 4.0
CUTOFF_FLOOR_S = 60.0
CUTOFF_CEILING_S = 600.0
QUANTILE = 0.9


@dataclass(slots=True)
class Pause:
    start: float
    deadline: float  # start + its cut-off: past it the pause protects nothing
    cut: bool = False


class Pauses:
    """The open pauses of active workflows, the agents back from a tool whose call is due, and the durations;
    each change told to the workflows' `registry` (a tool event is activity, an open pause holds the lease) and
    to `changed` (workflow, now): a pause began, ended (by its end or by the agent's next call) or was cut off."""

    def __init__(
        self,
        registry: WorkflowRegistry,
        changed: Callable[[WorkflowKey, float], None] | None = None,
        ceiling_s: float = CUTOFF_CEILING_S,
    ) -> None:
        if ceiling_s <= 0:
            raise ValueError(f"ceiling_s must be > 0, got {ceiling_s}")
        self.registry = registry
        self.changed = changed
        self.ceiling_s = ceiling_s
        # workflow -> (agent, tool) -> its open pause, oldest first (cut ones too: their end still teaches)
        self.open: dict[WorkflowKey, dict[tuple[str, str], Pause]] = {}
        # workflow -> agent -> when its last open tool ended: its next call is due
        self.returned: dict[WorkflowKey, dict[str, float]] = {}
        self.durations: dict[tuple[str, str], GapModel] = {}  # least recently learned first
        self.every_tool = GapModel()  # every pair's durations: for a pair with few of its own
        # (deadline, sequence, workflow, agent, tool): when each open pause is cut off (stale entries skipped)
        self._deadlines: list[tuple[float, int, WorkflowKey, str, str]] = []
        self._sequence = 0
        self.holding = 0  # open pauses not cut off
        self.cut_off = 0  # pauses cut off so far

    # -- events

    def start(self, workflow: WorkflowKey, agent: str, tool: str, now: float) -> bool:
        """`agent` of `workflow` called `tool` at `now` and waits on it; False (nothing kept) when the workflow
        is not active."""
        self.cut(now)
        if not self.registry.is_active(workflow):
            return False
        pauses = self.open.get(workflow)
        if pauses is None:
            pauses = self.open[workflow] = {}
        key = (agent, tool)
        if key in pauses:  # a start whose end went unheard: the new call replaces it
            self._close(pauses, key)
        elif len(pauses) >= MAX_PAUSES_PER_WORKFLOW:
            self._close(pauses, next(iter(pauses)))
        pause = pauses[key] = Pause(now, now + self.cutoff(agent, tool))
        self.holding += 1
        returned = self.returned.get(workflow)
        if returned is not None and returned.pop(agent, None) is not None and not returned:
            del self.returned[workflow]
        self._sequence += 1
        heapq.heappush(self._deadlines, (pause.deadline, self._sequence, workflow, agent, tool))
        if len(self._deadlines) > 2 * self.holding + 1024:  # mostly pauses ended before their cut-off
            live = [(w, a, t, p) for w, ps in self.open.items() for (a, t), p in ps.items() if not p.cut]
            self._deadlines = [(p.deadline, i, w, a, t) for i, (w, a, t, p) in enumerate(live)]
            heapq.heapify(self._deadlines)
        self._told(workflow, now)
        return True

    def end(self, workflow: WorkflowKey, agent: str, tool: str, now: float) -> bool:
        """`agent`'s call of `tool` returned at `now`; False when no such pause was open."""
        self.cut(now)
        pauses = self.open.get(workflow)
        if pauses is None or (agent, tool) not in pauses:
            return False
        pause = self._close(pauses, (agent, tool))
        self.learn(agent, tool, now - pause.start)
        if not any(a == agent for a, _ in pauses):  # its last tool returned: its call is due
            returned = self.returned.get(workflow)
            if returned is None:
                returned = self.returned[workflow] = {}
            elif agent not in returned and len(returned) >= MAX_PAUSES_PER_WORKFLOW:
                del returned[next(iter(returned))]
            returned[agent] = now
        if not pauses:
            del self.open[workflow]
        self._told(workflow, now)
        return True

    def request(self, workflow: WorkflowKey, agent: str, now: float) -> bool:
        """`agent` of `workflow` calls again at `now`: that ends its pauses (a client may never send tool_end) and
        its return. False when it had neither."""
        changed = False
        pauses = self.open.get(workflow)
        if pauses is not None:
            for key in [k for k in pauses if k[0] == agent]:
                pause = self._close(pauses, key)
                self.learn(agent, key[1], now - pause.start)
                changed = True
            if not pauses:
                del self.open[workflow]
        returned = self.returned.get(workflow)
        if returned is not None and returned.pop(agent, None) is not None:
            changed = True
            if not returned:
                del self.returned[workflow]
        if changed:  # the caller's request is news enough: not told to `changed`
            self.registry.hold(workflow, self.held_until(workflow))
        return changed

    def drop(self, workflow: WorkflowKey) -> None:
        """The workflow ended or retired: its pauses go, learning nothing."""
        pauses = self.open.pop(workflow, None)
        if pauses is not None:
            self.holding -= sum(not p.cut for p in pauses.values())
        self.returned.pop(workflow, None)

    def cut(self, now: float) -> None:
        """Cut off every pause whose deadline passed by `now`: it protects nothing, and its workflow's lease counts
        from the cut-off (`held_until`)."""
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            deadline, _, workflow, agent, tool = heapq.heappop(deadlines)
            pauses = self.open.get(workflow)
            pause = pauses.get((agent, tool)) if pauses is not None else None
            if pause is not None and not pause.cut and pause.deadline == deadline:
                pause.cut = True
                self.holding -= 1
                self.cut_off += 1
                if self.changed is not None:
                    self.changed(workflow, now)

    def _told(self, workflow: WorkflowKey, now: float) -> None:
        """A tool event of `workflow` at `now`: activity, and its open pauses hold it until their cut-off."""
        self.registry.touch(workflow, now)
        self.registry.hold(workflow, self.held_until(workflow))
        if self.changed is not None:
            self.changed(workflow, now)

    def _close(self, pauses: dict[tuple[str, str], Pause], key: tuple[str, str]) -> Pause:
        pause = pauses.pop(key)
        if not pause.cut:
            self.holding -= 1
        return pause

    # -- durations

    def learn(self, agent: str, tool: str, duration: float) -> None:
        key = (agent, tool)
        model = self.durations.pop(key, None)
        if model is None:
            model = GapModel(window=PER_TOOL_DURATIONS)
            if len(self.durations) >= MAX_TOOL_MODELS:
                del self.durations[next(iter(self.durations))]
        self.durations[key] = model  # last: most recently learned
        model.add(duration)
        self.every_tool.add(duration)

    def model(self, agent: str, tool: str) -> GapModel:
        """The pair's durations where it has MIN_DURATIONS of them, else every pair's."""
        model = self.durations.get((agent, tool))
        return model if model is not None and model.count >= MIN_DURATIONS else self.every_tool

    def cutoff(self, agent: str, tool: str) -> float:
        """How long a pause of the pair protects at most: CUTOFF_P90_MULTIPLE x its p90, within the floor (also
        where nothing is known) and the ceiling."""
        model = self.model(agent, tool)
        learned = CUTOFF_P90_MULTIPLE * model.quantile(QUANTILE) if model.count >= MIN_DURATIONS else 0.0
        return min(max(learned, CUTOFF_FLOOR_S), self.ceiling_s)

    # -- what a policy reads

    def due(self, workflow: WorkflowKey, now: float) -> float:
        """Expected seconds until the workflow's next call, by its agents that wait on a tool (the residual of
        the tool's duration given the time waited) or are back from one (imminent, the time since counted as
        its lateness); -1.0 where none does (no pause, or only cut ones)."""
        due = -1.0
        pauses = self.open.get(workflow)
        if pauses is not None:
            for (agent, tool), pause in pauses.items():
                if not pause.cut:
                    left = self.model(agent, tool).residual(max(now - pause.start, 0.0))
                    if due < 0.0 or left < due:
                        due = left
        returned = self.returned.get(workflow)
        if returned is not None:
            for ended in returned.values():
                late = max(now - ended, 0.0)
                if due < 0.0 or late < due:
                    due = late
        return due

    def waiting(self, workflow: WorkflowKey) -> list[str]:
        """The agents of the workflow that wait on a tool (not cut off) or are back from one: its next caller."""
        agents: list[str] = []
        pauses = self.open.get(workflow)
        if pauses is not None:
            for (agent, _), pause in pauses.items():
                if not pause.cut and agent not in agents:
                    agents.append(agent)
        returned = self.returned.get(workflow)
        if returned is not None:
            for agent in returned:
                if agent not in agents:
                    agents.append(agent)
        return agents

    def held_until(self, workflow: WorkflowKey) -> float:
        """Until when the workflow's open pauses count as its activity: the latest cut-off (one past already
        counts up to then, and no longer); 0.0: none open."""
        pauses = self.open.get(workflow)
        if pauses is None:
            return 0.0
        return max(p.deadline for p in pauses.values())

    def counts(self) -> dict[str, int]:
        """Open pauses within their cut-off now, and pauses cut off so far."""
        return {"open": self.holding, "cut_off": self.cut_off}
