"""pbkv's demand bookkeeping: each active workflow's timing weight phi_w, and each agent's demand D(a).

D(a) = sum over active workflows w of phi_w v_w(a), plus one for each request of a waiting to be served
(`pending`) and the calls of workflows not yet started (`arrivals`): what a fixed prompt of agent a is worth.
Each workflow's change updates its part at once; a refresh (every REFRESH_EVERY requests, see
agentcache.policy.pbkv.policy) recomputes every weight and D(a) whole, so that the running sums never drift.
A key reads the weight and demand it was computed with (`weights`, `keyed`) until they moved by more than
CHANGE: every request moves some demand a little, and the keys of shared prompts are many.
"""

from __future__ import annotations

from typing import NamedTuple

from agentcache.policy.gaps import GapModel
from agentcache.policy.pbkv.forecasts import Forecasts
from agentcache.policy.pbkv.ingredients import Ingredients
from agentcache.policy.pbkv.keys import EvictionKeys
from agentcache.policy.pbkv.timing import Timing
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.tags import Tags, WorkflowKey

MAX_FORECAST_WORKFLOWS = 1024  # workflows whose forecasts are summed per refresh, most recent first
CHANGE = 0.01  # a weight or demand that moved by more than this (relative) re-keys the nodes that read it
NO_VALUES: dict[str, float] = {}  # shared, never written: the forecast values of a workflow with none yet


class Part(NamedTuple):
    """A workflow's part of the demand D(a)."""

    weight: float  # its timing weight phi_w
    values: dict[str, float]  # its forecast values v_w(a) (shared by the workflows at the same point)
    waiting: str | None  # the agent of its request not served yet (pending)


class Demand:
    def __init__(
        self,
        ingredients: Ingredients,
        registry: WorkflowRegistry,
        timing: Timing,
        forecasts: Forecasts,
        keys: EvictionKeys,
    ) -> None:
        self.ingredients = ingredients
        self.registry = registry
        self.timing = timing
        self.forecasts = forecasts
        self.keys = keys
        # workflow -> timing weight phi_w as its nodes' keys read it: the current one, kept until that moved by
        # more than CHANGE.
        self.weights: dict[WorkflowKey, float] = {}
        # D(a), kept up to date by each workflow's change (its part is in `parts`) and recomputed whole at every
        # refresh; `keyed`: the demand each agent's fixed-prompt keys were computed with.
        self.demand: dict[str, float] = {}
        self.parts: dict[WorkflowKey, Part] = {}
        self.arrivals: dict[str, float] = {}
        self.keyed: dict[str, float] = {}
        self.pending: dict[WorkflowKey, str] = {}  # workflow -> the agent of its request not served yet
        # Requests arrived and not admitted yet that no key has counted as pending: counted at the next eviction
        # round or key (count_waiting); one admitted before that is forgotten at no cost.
        self.arrived: dict[WorkflowKey, str] = {}

    # -- requests waiting to be served

    def arrive(self, state: WorkflowState, agent: str) -> None:
        if state.id in self.pending:  # an earlier request of the workflow is counted waiting: this one instead
            self.pending[state.id] = agent
        else:
            self.arrived[state.id] = agent

    def count_waiting(self) -> None:
        """Count the requests that arrived since the last eviction round and still wait as pending."""
        arrived, self.arrived = self.arrived, {}
        get = self.registry.get
        for workflow, agent in arrived.items():
            state = get(workflow)
            if state is not None:
                self.pending[workflow] = agent
                self.update(state)

    def admit(self, tags: Tags) -> None:
        workflow = tags.key
        if self.arrived.get(workflow) == tags.identity:  # admitted before any key counted it waiting
            del self.arrived[workflow]
            return
        if self.pending.get(workflow) == tags.identity:  # its prefix is held now: eviction cannot take it
            del self.pending[workflow]
            self.registry.version += 1  # the demand changes
            state = self.registry.get(workflow)
            if state is not None:
                self.update(state)

    def ended(self, workflow: WorkflowKey) -> None:
        self.pending.pop(workflow, None)
        self.arrived.pop(workflow, None)
        self.weights.pop(workflow, None)
        self.set_part(workflow, None)

    # -- a workflow's part

    def update(self, state: WorkflowState) -> None:
        """A workflow moved on (or its request was admitted): its weight, its part of the demand, its nodes."""
        workflow = state.id
        keyed_weight, before = self.weights.get(workflow), self.parts.get(workflow)
        weight = self.weights[workflow] = self.timing.weight(state)
        part = Part(weight, self.forecasts.values.get(workflow, NO_VALUES), self.pending.get(workflow))
        self.set_part(workflow, part)
        nodes = self.keys.nodes_of.get(workflow)
        if keyed_weight is None or before is None:  # nothing to compare with: every key may have fallen
            self.keys.invalidate(nodes)
        else:  # the keys read the keyed weight and the values and waiting agent of the part they replace
            fallen = _fallen(Part(keyed_weight, before.values, before.waiting), part)
            self.keys.invalidate(nodes, fallen=(workflow, fallen))

    def set_part(self, workflow: WorkflowKey, part: Part | None) -> None:
        """Replace a workflow's part of the demand D(a); the fixed prompts of the agents it touches change key."""
        if not self.ingredients.fixed_by_forecast:
            return
        demand = self.demand
        old = self.parts.pop(workflow, None) if part is None else self.parts.get(workflow)
        changed: set[str] = set()
        # Where only the pending request changed (its admission), the forecast's terms stay as they are.
        same_forecast = old is not None and part is not None and old.weight == part.weight and old.values is part.values
        for sign, entry in ((-1.0, old), (1.0, part)):
            if entry is None:
                continue
            weight, values, waiting = entry
            if not same_forecast:
                signed, get = sign * weight, demand.get
                for agent, v in values.items():
                    demand[agent] = get(agent, 0.0) + signed * v
                changed.update(values)
            if waiting is not None:
                demand[waiting] = demand.get(waiting, 0.0) + sign
                changed.add(waiting)
        if part is not None:
            self.parts[workflow] = part
        keyed = self.keyed
        for agent in changed:
            now, then = demand[agent], keyed.get(agent, 0.0)
            if moved(then, now):
                keyed[agent] = now
                self.keys.invalidate(self.keys.fixed_nodes.get(agent), rising=now > then)

    # -- every part at once

    def refresh(self) -> None:
        """Recompute each workflow's weight and the arrivals; the demand D(a) whole (no drift of its running
        sums). Keys are recomputed where a value moved by more than CHANGE."""
        ingredients, timing, keys = self.ingredients, self.timing, self.keys
        weights: dict[WorkflowKey, float] = {}
        parts: dict[WorkflowKey, Part] = {}
        by_arrivals = ingredients.fixed_by_forecast and ingredients.arrivals
        self.arrivals = self.forecasts.arrivals(timing.new_per_step()) if by_arrivals else {}
        demand: dict[str, float] = dict(self.arrivals)
        # The most recently active workflows only: bounded work per refresh, however many workflows
        # hostile or forgetful clients leave open (the older ones are the least likely to call soon).
        step_gap = timing.gaps.mean
        timed = ingredients.timing and step_gap > 0.0
        chosen: dict[str | None, GapModel] = {}
        keyed_weights, nodes_of, values_of, pending = self.weights, keys.nodes_of, self.forecasts.values, self.pending
        by_forecast = ingredients.fixed_by_forecast
        # Workflows at the same point share one forecast (one values object): its weights are summed first,
        # and each shared forecast is added to the demand once.
        weight_of_values: dict[int, list] = {}
        for state in self.registry.recent(MAX_FORECAST_WORKFLOWS):
            workflow = state.id
            weight = timing.refresh_weight(state, chosen, step_gap) if timed else 1.0
            keyed_weight = keyed_weights.get(workflow)
            if keyed_weight is None or moved(keyed_weight, weight):
                rising = keyed_weight is not None and weight > keyed_weight
                keys.invalidate(nodes_of.get(workflow), rising=rising)
                keyed_weight = weight
            weights[workflow] = keyed_weight
            if by_forecast:  # the parts are kept only where they make the demand (as set_part keeps them)
                values = values_of.get(workflow, NO_VALUES)
                waiting = pending.get(workflow)
                parts[workflow] = Part(weight, values, waiting)
                summed = weight_of_values.get(id(values))
                if summed is None:
                    weight_of_values[id(values)] = [values, weight]
                else:
                    summed[1] += weight
                if waiting is not None:
                    demand[waiting] = demand.get(waiting, 0.0) + 1.0
        for values, weight in weight_of_values.values():
            for agent, v in values.items():
                demand[agent] = demand.get(agent, 0.0) + weight * v
        keyed = {}  # agents absent from the demand have none (and keep no entry)
        for agent in demand.keys() | self.keyed.keys():
            now, then = demand.get(agent, 0.0), self.keyed.get(agent, 0.0)
            if moved(then, now):
                keys.invalidate(keys.fixed_nodes.get(agent), rising=now > then)
                then = now
            if agent in demand:
                keyed[agent] = then
        self.weights, self.parts, self.demand, self.keyed = weights, parts, demand, keyed


def _fallen(before: Part, after: Part) -> set[str]:
    """The agents whose term in a workflow's node values (weight x forecast value, and 1 for the agent it
    has waiting) is lower `after` than `before`: a node none of whose pairs is one of them did not fall."""
    (weight_before, values_before, waiting_before), (weight, values, waiting) = before, after
    if values is values_before and weight >= weight_before:
        fallen = set()
    else:
        fallen = {a for a, v in values_before.items() if weight * values.get(a, 0.0) < weight_before * v}
    if waiting_before is not None and waiting_before != waiting:
        fallen.add(waiting_before)
    return fallen


def moved(old: float | None, new: float | None) -> bool:
    """Whether a value changed by more than CHANGE of itself (appearing or disappearing counts)."""
    if old is None or new is None:
        return old is not new
    # abs() and max() spelled out: this runs for every workflow at every refresh.
    larger = new if new >= 0.0 else -new
    other = old if old >= 0.0 else -old
    if other > larger:
        larger = other
    return (new - old if new > old else old - new) > CHANGE * larger
