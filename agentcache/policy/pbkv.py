"""PBKV: retired cache first, then a K-step forecast score, LRU within ties.

The paper's score (PBKV, Eq. 5):

    Score(c) = sum_{k=1..K} gamma^(k-1) sum_{w in W_act(c)} s_w^(k) * A_w(c)^T P_w^(k)

W_act(c) are the active workflows that touched node c, A_w(c) marks the agents
of w that touched it, P_w^(k) is the forecast of w's k-th next agent and
s_w^(k) the probability that w is still running then. Our predictors' rows are
unconditional with END absorbing, so s_w^(k) * P_w^(k)(a) is row k's p(a) and

    Score(c) = sum_{w in W_act(c)} sum_{a in A_w(c)} v_w(a),   v_w(a) = sum_k gamma^(k-1) P_w^(k)(a)

the expected discounted number of future reads of c (Lemma G.1). Cache that
only ended workflows touched is evicted before any scored node: a fact
outranks an estimate.

That fact fails where a workflow is a single request, as in plain chat: a
conversation's next turn is a workflow of its own and reads what the ended
previous turn wrote, while the turn that just ended forecast almost nothing
for itself. So (retired_evidence) the policy counts how often retired cache
is read again (reads per node retired, fixed prompts aside) and ranks with
the retired tier every node whose own workflows' forecast is worth less than
that; within the tier, generated output that no prompt has re-sent yet goes
before prompts (SGLang's priority order), then LRU. Where retired cache is
never read again, as in agent workflows, the share stays 0 and nothing moves.

As written, the score undervalues an agent's fixed prompt: a workflow that
has not called the agent yet adds nothing to it, nor does a workflow that has
not started. SGLang's LFU protects such prompts through global hit counts,
which is why it beats the paper's score on real traces. Our default adds, as
switchable ingredients (see docs/design/policy.md for what each one is worth):

- fixed_by_forecast: a node of agent a's fixed prompt is worth every active
  workflow's forecast of calling a, ``D(a) = sum_{w active} v_w(a)``, touched or not;
- arrivals: plus the calls of workflows not yet started,
  ``lambda * g * sum_k gamma^(k-1) sum_{j<=k} P_new^(j)(a)``, with lambda the
  workflow arrival rate, g the mean gap between a workflow's requests (both
  learned online) and P_new the forecast for a workflow with an empty path;
- cost: the score is multiplied by what a miss of c costs per token held
  (recompute with its context-length term, or a reload when c has a host copy);
- fallback: nodes no forecast values (tagged by no active workflow's agents,
  or untagged) are ordered by their observed read frequency, then recency;
- reuse: how each agent reuses its own last request's path, learned online
  instead of assumed: when the agent's next request in the workflow arrives,
  how much did it read again of the previous request's context (what that
  request had read from cache after its fixed prompt), of its fresh prompt
  tokens, and of its generated tokens? Appending apps read all three; most
  real multi-agent apps rebuild their prompts from shared context, read the
  context and never the fresh tail; phased ones drop the context when the
  phase changes. A node on a (workflow, agent)'s latest path is valued by the
  agent's share for the part it lies in; where the previous path was evicted
  before the next request came, nothing is learned;
- pending: a request that has arrived but is not served yet (queued behind
  others on a busy server) reads its agent's cache for certain: that agent
  counts one read at step 0 for its workflow until the engine admits the
  request (and holds its prefix). The forecasts have already moved past it,
  to what comes after; the replay admits each request as it arrives, so only
  a live server queues. Most requests are admitted before any eviction sees
  them waiting: a request counts as pending only from the first eviction
  round (or key) while it waits, so one admitted at once costs nothing.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy.base import (
    CONTEXT,
    FORGOTTEN,
    FRESH,
    MAX_TRACKED_AGENTS,
    OUTPUT,
    RISEN,
    TAGS_ATTR,
    CacheNode,
    CachePolicy,
    Latest,
    NodeClass,
    NodeTags,
    node_tokens,
    tags_of,
)
from agentcache.policy.gaps import GapModel
from agentcache.policy.prefetch import Candidate
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor import END, Predictor, PredictorSpec
from agentcache.predictor.base import AgentCoverage, PerForecast
from agentcache.predictor.guard import GuardedPredictor
from agentcache.predictor.markov import DEFAULT_ORDER
from agentcache.tags import Tags, WorkflowKey


@dataclass(frozen=True)
class Ingredients:
    lifecycle: bool = True
    retired_evidence: bool = True
    retired_ages: bool = True
    fixed_by_forecast: bool = True
    arrivals: bool = True
    current_paths: bool = True
    timing: bool = True
    evidence: bool = True
    cost: bool = False
    fallback: bool = True
    pending: bool = True
    reuse: bool = True


MAX_FORECAST_WORKFLOWS = 1024  # workflows whose forecasts are summed per refresh, most recent first
# SGLang asks for the key of every evictable leaf at every eviction, so keys are kept on the nodes and
# recomputed only when something they depend on changed: their node was used, a workflow they serve moved
# on, a fixed prompt's demand changed. What changes with time alone (how soon each workflow calls again,
# the arrival rate) is refreshed every REFRESH_EVERY requests, or every REFRESH_SHARE of the workflows a
# refresh visits where that is more (a refresh costs one step per workflow: its cost per request stays
# bounded however many are open), and a workflow's nodes or a fixed prompt recomputed where that moved its
# value by more than CHANGE (relative); every key is recomputed every EPOCH_REFRESHES refreshes (what drifts
# slowly: the reuse shares, read rates). A workflow's own requests update its values at once.
REFRESH_EVERY = 16
REFRESH_SHARE = 4
CHANGE = 0.01
EPOCH_REFRESHES = 8
MAX_READ_FORECASTS = 1024  # forecasts whose values are kept for the next workflow at the same point
MAX_GAP_MODELS = 1024  # agents whose gap distribution is kept
PER_AGENT_GAPS = 128  # recent gaps kept per agent
MIN_AGENT_GAPS = 8  # fewer than this: use every workflow's gaps
MAX_REUSE_AGENTS = 1024  # agents whose reuse of their own fresh cache is tracked
REUSE_PRIOR = 2.0  # the weight (in observations) an agent's reuse and retired-read estimates give their prior
# Retired nodes' ages (RetiredAges): told apart in half-octaves above AGE_RESOLUTION_S, in AGE_BUCKETS buckets
# (the last one reaches past a century); the evidence is halved every AGE_HALF_EVENTS reads and evictions, so
# the curves follow a workload that changes.
AGE_RESOLUTION_S = 0.05
AGE_BUCKETS = 64
AGE_HALF_EVENTS = 4096
MAX_REKEYS = 1 << 16  # scheduled re-keys kept before the stale ones are dropped
# Shared, never written: the forecast values of a workflow with none yet, the latest paths of one with none.
NO_VALUES: dict[str, float] = {}
NO_LATEST: dict[str, Latest] = {}

PAPER = Ingredients(
    retired_evidence=False,
    retired_ages=False,
    fixed_by_forecast=False,
    arrivals=False,
    current_paths=False,
    timing=False,
    evidence=False,
    cost=False,
    fallback=False,
    pending=False,
    reuse=False,
)


def default_forecaster(order: int = DEFAULT_ORDER) -> Predictor:
    """pbkv's own forecaster (of `order`): what it consults unless given another; the one `markov-n:<order>`
    names (re-rolled at the serving pace, over the spec's horizon)."""
    return PredictorSpec("markov-n", order=order).build()


class PBKVPolicy(CachePolicy):
    name = "pbkv"
    keeps_keys = True

    def __init__(
        self,
        registry: WorkflowRegistry | None = None,
        predictor: Predictor | None = None,
        gamma: float = 0.8,
        ingredients: Ingredients = Ingredients(),
        cost: CostModel = DEFAULT_COST,
        predictor_budget_ms: float | None = None,
    ):
        super().__init__(registry)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        # Default forecaster: online Markov over the last DEFAULT_ORDER agents, backing off to shorter
        # contexts where data is thin (history-dependent exits such as retry caps need the longer ones).
        chosen = predictor if predictor is not None else default_forecaster()
        self.predictor = GuardedPredictor(chosen, budget_ms=predictor_budget_ms)
        self.gamma = gamma
        self.ingredients = ingredients
        self.cost = cost
        self.gaps = GapModel()  # gaps between a workflow's consecutive requests
        self.gaps_after: dict[str, GapModel] = {}  # the same, by the agent of the earlier request
        self.arrival_gap = 0.0  # EWMA of the time between new workflows (1 / lambda)
        self._last_start: float | None = None
        self._now = 0.0
        # workflow -> v_w(a), refreshed on its transitions; workflows at the same point share one (read-only)
        self._values: dict[WorkflowKey, dict[str, float]] = {}
        self._next: dict[WorkflowKey, dict[str, float]] = {}  # workflow -> P_w^(1)(a), for prefetching (shared)
        # each forecast's v(a) and P^(1)(a), read once for every workflow at the same point
        self._read_forecasts: PerForecast[tuple[dict[str, float], dict[str, float]]] = PerForecast(MAX_READ_FORECASTS)
        # workflow -> timing weight phi_w as its nodes' keys read it: the current one, kept until that moved by
        # more than CHANGE. Keys read only these, _keyed_demand and the reuse shares frozen at the epoch's
        # start, so a key changes only where its node is invalidated, and grows where one of these grew.
        self._weights: dict[WorkflowKey, float] = {}
        # D(a) = sum over active workflows of phi_w v_w(a), plus pending requests and arrivals; kept up to date
        # by each workflow's change (its part is in _parts) and recomputed whole at every refresh.
        self._demand: dict[str, float] = {}
        self._parts: dict[WorkflowKey, tuple[float, dict[str, float], str | None]] = {}  # weight, values, pending
        self._arrivals: dict[str, float] = {}
        # The demand each agent's fixed-prompt keys were computed with: they are recomputed once it moved by
        # more than CHANGE (every request moves some demand a little; the keys of shared prompts are many).
        self._keyed_demand: dict[str, float] = {}
        self._pending: dict[WorkflowKey, str] = {}  # workflow -> the agent of its request not served yet
        # Requests arrived and not admitted yet that no key has counted as pending: counted at the next eviction
        # round or key (_count_waiting); one admitted before that is forgotten at no cost.
        self._arrived: dict[WorkflowKey, str] = {}
        self.reuse = ReuseEvidence()
        self.retired_reads = RetiredReads()
        self.retired_ages = RetiredAges()
        # (policy clock, sequence, tags): when a retired node's key changes with its age alone (RetiredAges)
        self._rekeys: list[tuple[float, int, NodeTags]] = []
        self._rekey_sequence = 0
        # Kept eviction keys: a node's key is current while it was computed in this epoch and nothing it
        # depends on changed since (then its key_epoch is reset). A refresh starts a new epoch.
        self._epoch = 0
        self._refreshes = 0
        # The work done, for benchmarks and tests (the compiled policy's methods cannot be wrapped to count it):
        # eviction keys asked for and those computed (the rest were kept), timing weights computed.
        self.keys_asked = self.keys_computed = self.weights_computed = 0
        self._refresh_every = REFRESH_EVERY
        self._since_refresh = REFRESH_EVERY  # refresh at the first request
        # active workflow -> the nodes it touched whose keys read it (a fixed prompt's read the demand alone)
        self._nodes_of: dict[WorkflowKey, dict[int, NodeTags]] = {}
        self._fixed_nodes: dict[str, dict[int, NodeTags]] = {}  # agent -> nodes of its fixed prompt
        # workflow -> agent -> the pair's previous request, while its running request's prompt is in the tree
        # (SGLang tags it there before it finishes, and that tagging makes it the pair's latest): what the
        # finish compares the request's read with, to learn the agent's reuse.
        self._before_running: dict[WorkflowKey, dict[str, Latest]] = {}

    # -- learning

    def on_request(self, tags: Tags, now: float) -> WorkflowState:
        self._now = now
        if self._rekeys:
            self._rekey_aged(now)
        self._since_refresh += 1
        if self._since_refresh >= self._refresh_every:
            self._refresh()
        known = self.registry.get(tags.key)
        if known is not None:
            gap = now - known.last_seen
            self.gaps.add(gap)
            if known.agent is not None:
                per_agent = self.gaps_after.get(known.agent)
                if per_agent is None:
                    if len(self.gaps_after) >= MAX_GAP_MODELS:
                        del self.gaps_after[next(iter(self.gaps_after))]
                    per_agent = self.gaps_after[known.agent] = GapModel(window=PER_AGENT_GAPS)
                per_agent.add(gap)
        else:
            if self._last_start is not None:
                self.arrival_gap = _ewma(self.arrival_gap, now - self._last_start)
            self._last_start = now
        state = super().on_request(tags, now)
        if self.ingredients.pending:
            if state.id in self._pending:  # an earlier request of the workflow is counted waiting: this one instead
                self._pending[state.id] = tags.identity
            else:
                self._arrived[state.id] = tags.identity
        self._update(state)
        return state

    def _count_waiting(self) -> None:
        """Count the requests that arrived since the last eviction round and still wait as pending."""
        arrived, self._arrived = self._arrived, {}
        get = self.registry.get
        for workflow, agent in arrived.items():
            state = get(workflow)
            if state is not None:
                self._pending[workflow] = agent
                self._update(state)

    def take_changed_keys(self) -> list[NodeTags] | None:
        if self._arrived:  # an eviction round starts: requests still waiting are pending now
            self._count_waiting()
        return super().take_changed_keys()

    def on_admit(self, tags: Tags) -> None:
        workflow = tags.key
        if self._arrived.get(workflow) == tags.identity:  # admitted before any key counted it waiting
            del self._arrived[workflow]
            return
        if self._pending.get(workflow) == tags.identity:  # its prefix is held now: eviction cannot take it
            del self._pending[workflow]
            self.registry.version += 1  # the demand changes
            state = self.registry.get(workflow)
            if state is not None:
                self._update(state)

    def tag_path(
        self,
        path: Sequence[Any],
        tags: Tags,
        now: float,
        matched_tokens: int | None,
        prompt_tokens: int | None = None,
    ) -> None:
        workflow, agent = tags.key, tags.identity
        counts_retired_reads = self.ingredients.retired_evidence or self.ingredients.retired_ages
        previous = superseded = self.latest.get(workflow, NO_LATEST).get(agent)
        if matched_tokens is None:  # the prompt is in the tree and the request runs on
            if previous is not None and previous.matched is not None:
                self._before_running.setdefault(workflow, {})[agent] = previous
            previous = None
        elif previous is not None and previous.matched is None:  # tagged while it ran: its own, not the last
            waiting = self._before_running.get(workflow)
            previous = waiting.pop(agent, None) if waiting else None
        if counts_retired_reads or previous is not None:
            read = _read_from_cache(path, matched_tokens)
            if counts_retired_reads:
                self._count_retired_reads(read, workflow)
            if previous is not None:
                self.reuse.observe(agent, previous, read)
        super().tag_path(path, tags, now, matched_tokens, prompt_tokens)
        self.on_admit(tags)  # served, in case its admission went unreported
        if superseded is not None:  # the pair's current path moved: its old one's nodes lose the pair's value
            self._invalidate_superseded(workflow, agent, superseded.stamp)
        active = self.registry.is_active(workflow)
        mine = self._nodes_of.setdefault(workflow, {}) if active else None
        fixed_nodes = None
        for node in path:
            t = getattr(node, TAGS_ATTR, None)
            if t is None:
                continue
            if t.key_epoch != FORGOTTEN:  # most were, as the workflow's nodes, just above
                self.forget_key(t)
            if mine is not None and self._keyed_by_workflows(t):
                mine[id(t)] = t
            if agent in t.fixed_agents:
                if fixed_nodes is None:
                    fixed_nodes = self._fixed_node(agent)
                fixed_nodes[id(t)] = t

    def _invalidate_superseded(self, workflow: WorkflowKey, agent: str, stamp: int) -> None:
        """Forget the keys of the workflow's nodes still stamped by the pair's superseded request: the ones its new
        path does not pass (tagging re-stamped those it does). Where SGLang tagged the request's prompt before
        it finished, its finish supersedes that tagging and passes every node of it: none."""
        nodes = self._nodes_of.get(workflow)
        if not nodes:
            return
        for t in nodes.values():
            agents = t.workflows.get(workflow)
            if agents is not None and agents.get(agent) == stamp and not t.evicted and t.key_epoch != FORGOTTEN:
                self.forget_key(t)

    def adopt(self, tags: NodeTags) -> None:
        if self._keyed_by_workflows(tags):
            for workflow in tags.workflows:
                mine = self._nodes_of.get(workflow)
                if mine is not None:
                    mine[id(tags)] = tags
        for agent in tags.fixed_agents:
            self._fixed_node(agent)[id(tags)] = tags

    def _keyed_by_workflows(self, t: NodeTags) -> bool:
        """Whether the key of `t`'s node reads the workflows that touched it, so that their changes re-key it.
        A fixed prompt's key reads its agents' demand alone (score), unless some request read the node past
        its own fixed prompt; asked as each request tags the node, after tagging set both."""
        return t.past_fixed or not t.fixed_agents or not self.ingredients.fixed_by_forecast

    def _fixed_node(self, agent: str) -> dict[int, NodeTags]:
        nodes = self._fixed_nodes.get(agent)
        if nodes is None:
            nodes = self._fixed_nodes[agent] = {}
            if len(self._fixed_nodes) > MAX_TRACKED_AGENTS:
                self._invalidate(self._fixed_nodes.pop(next(iter(self._fixed_nodes))))
        return nodes

    def on_evicted(self, t: NodeTags, tokens: int, node_class: str) -> None:
        if self.ingredients.retired_ages and node_class == NodeClass.RETIRED and not t.fixed_agents:
            self.retired_ages.evicted(_latest_agents(t), self._now - t.last_access, tokens)

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        path = state.path  # the transition's agent appended
        self.predictor.observe(path[:-1], path[-1])
        rows = self.predictor.predict(path)
        # Workflows at the same point get the same rows (until the predictor refreshes): read them once.
        read = self._read_forecasts.get(rows)
        if read is None:
            next_agents = {a: p for a, p in rows[0].items() if a != END and p > 0.0}
            read = (self.discounted(rows), next_agents)
            self._read_forecasts.put(rows, read)
        self._values[state.id], self._next[state.id] = read

    def on_workflow_retired(self, state: WorkflowState) -> None:
        self.predictor.observe(state.path, END)
        self._values.pop(state.id, None)
        self._next.pop(state.id, None)
        self._pending.pop(state.id, None)
        self._arrived.pop(state.id, None)
        self._weights.pop(state.id, None)
        self._set_part(state.id, None)
        self._before_running.pop(state.id, None)
        nodes = self._nodes_of.pop(state.id, None)
        if nodes and self.ingredients.retired_evidence:
            for t in nodes.values():
                if not t.evicted and not t.fixed_agents and self.is_retired(t):
                    self.retired_reads.retired(t.workflows.get(state.id, ()))
        self._invalidate(nodes)  # its nodes may be retired now

    def coverages(self) -> list[AgentCoverage]:
        return [self.predictor.coverage]

    def prefetch_candidates(self) -> list[Candidate]:
        """Each active workflow's history for its likely next agent, and those agents' fixed prompts,
        valued by the probability of being read at the very next step (PBKV's one-step reuse value)."""
        out = []
        next_callers: dict[str, float] = {}
        for workflow, row in self._next.items():
            latest = self.latest.get(workflow, NO_LATEST)
            for agent, p in row.items():
                next_callers[agent] = next_callers.get(agent, 0.0) + p
                if agent in latest:
                    out.append(Candidate(latest[agent].end, p))
        for agent, p in next_callers.items():
            node = self.fixed_leaf.get(agent)
            if node is not None:
                out.append(Candidate(node, p, fixed_agent=agent))
        return out

    # -- forecasts

    def discounted(self, rows: list[dict[str, float]]) -> dict[str, float]:
        """sum_k gamma^(k-1) row_k(a) for every agent a."""
        values: dict[str, float] = {}
        weight = 1.0
        for row in rows:
            for agent, p in row.items():
                if agent != END:
                    values[agent] = values.get(agent, 0.0) + weight * p
            weight *= self.gamma
        return values

    def arrivals(self) -> dict[str, float]:
        """Discounted calls of each agent by workflows that start within the horizon."""
        step_gap = self.gaps.mean
        if self.arrival_gap <= 0.0 or step_gap <= 0.0:
            return {}
        per_step = step_gap / self.arrival_gap  # lambda * g: new workflows per step
        arrivals: dict[str, float] = {}
        cumulative: dict[str, float] = {}
        weight = 1.0
        for row in self.predictor.predict([]):
            for agent, p in row.items():
                if agent != END:
                    cumulative[agent] = cumulative.get(agent, 0.0) + p
            for agent, c in cumulative.items():
                arrivals[agent] = arrivals.get(agent, 0.0) + per_step * weight * c
            weight *= self.gamma
        return arrivals

    def timing_weight(self, state: WorkflowState) -> float:
        """gamma^(residual / g): step discounting continued into the time before w's next request."""
        step_gap = self.gaps.mean
        if not self.ingredients.timing or step_gap <= 0.0:
            return 1.0
        return self._weight(state, self._gaps_after(state), step_gap)

    def _weight(self, state: WorkflowState, gaps: GapModel, step_gap: float) -> float:
        self.weights_computed += 1
        return self.gamma ** (gaps.residual(self._now - state.last_seen) / step_gap)

    def _gaps_after(self, state: WorkflowState) -> GapModel:
        """What follows an agent's call (a tool run, or none) shapes the wait: that agent's gaps where there
        are enough of them, else every workflow's."""
        path = state.path
        gaps = self.gaps_after.get(path[-1]) if path else None
        return gaps if gaps is not None and gaps.count >= MIN_AGENT_GAPS else self.gaps

    def _refresh_weight(self, state: WorkflowState, chosen: dict[str | None, GapModel], step_gap: float) -> float:
        """timing_weight for a refresh, which picks each agent's gaps once (in `chosen`) for all its workflows."""
        path = state.path
        agent = path[-1] if path else None
        gaps = chosen.get(agent)
        if gaps is None:
            gaps = chosen[agent] = self._gaps_after(state)
        return self._weight(state, gaps, step_gap)

    def _update(self, state: WorkflowState) -> None:
        """A workflow moved on (or its request was admitted): its weight, its part of the demand, its nodes."""
        workflow = state.id
        keyed_weight, before = self._weights.get(workflow), self._parts.get(workflow)
        weight = self._weights[workflow] = self.timing_weight(state)
        part = (weight, self._values.get(workflow, NO_VALUES), self._pending.get(workflow))
        self._set_part(workflow, part)
        if keyed_weight is None or before is None:  # nothing to compare with: every key may have fallen
            self._invalidate(self._nodes_of.get(workflow))
        else:  # the keys read the keyed weight and the values and waiting agent of the part they replace
            fallen = _fallen((keyed_weight, before[1], before[2]), part)
            self._invalidate(self._nodes_of.get(workflow), fallen=(workflow, fallen))

    def _set_part(self, workflow: WorkflowKey, part: tuple[float, dict[str, float], str | None] | None) -> None:
        """Replace a workflow's part of the demand D(a); the fixed prompts of the agents it touches change key."""
        if not self.ingredients.fixed_by_forecast:
            return
        demand = self._demand
        old = self._parts.pop(workflow, None) if part is None else self._parts.get(workflow)
        changed: set[str] = set()
        # Where only the pending request changed (its admission), the forecast's terms stay as they are.
        same_forecast = old is not None and part is not None and old[0] == part[0] and old[1] is part[1]
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
            self._parts[workflow] = part
        keyed = self._keyed_demand
        for agent in changed:
            now, then = demand[agent], keyed.get(agent, 0.0)
            if _moved(then, now):
                keyed[agent] = now
                self._invalidate(self._fixed_nodes.get(agent), rising=now > then)

    def _invalidate(
        self,
        nodes: dict[int, NodeTags] | None,
        rising: bool = False,
        fallen: tuple[WorkflowKey, set[str]] | None = None,
    ) -> None:
        """The keys of `nodes` changed (`rising`: one weight or demand they are valued by grew, nothing else
        changed; `fallen`: one workflow's terms changed, and only those of these agents fell); forget the
        evicted ones."""
        if not nodes:
            return
        if fallen is not None and not fallen[1]:  # no term fell: every key rose or stayed
            rising, fallen = True, None
        cost = self.ingredients.cost  # a miss's cost reads the node's host copy, unannounced: never rising
        rising = rising and not cost
        gone = None  # rarely any: no list made per call
        for key, t in nodes.items():
            if t.evicted:
                if gone is None:
                    gone = []
                gone.append(key)
            elif t.key_epoch != FORGOTTEN:  # else reported already since its key was last computed
                up = rising
                if fallen is not None and not cost:
                    agents = t.workflows.get(fallen[0])
                    up = agents is None or fallen[1].isdisjoint(agents)
                # A key grows with its forecast value; one valued by its read rate alone (value 0) reads a
                # rate that falls with time. One that can only have grown is not reported (RISEN): the heap
                # re-keys it when it reaches its top.
                if up and t.key is not None and t.key[1] > 0.0:
                    t.key_epoch = RISEN
                else:
                    self.forget_key(t)
        if gone is not None:
            for key in gone:
                del nodes[key]

    def _refresh(self) -> None:
        """Recompute what changes with time alone: each workflow's weight and the arrivals; the demand D(a)
        whole (no drift of its running sums). Keys are recomputed where a value moved by more than CHANGE,
        and all of them every EPOCH_REFRESHES refreshes."""
        self._since_refresh = 0
        self._refreshes += 1
        if self._refreshes % EPOCH_REFRESHES == 0 or self.reuse.doubled() or self.retired_reads.doubled():
            self._epoch += 1
            self.forget_all_keys()
            self.reuse.freeze()
            self.retired_reads.freeze()
        ingredients = self.ingredients
        if ingredients.retired_ages:
            self.retired_ages.freeze()
        weights: dict[WorkflowKey, float] = {}
        parts: dict[WorkflowKey, tuple[float, dict[str, float], str | None]] = {}
        self._arrivals = self.arrivals() if ingredients.fixed_by_forecast and ingredients.arrivals else {}
        demand: dict[str, float] = dict(self._arrivals)
        # The most recently active workflows only: bounded work per refresh, however many workflows
        # hostile or forgetful clients leave open (the older ones are the least likely to call soon).
        step_gap = self.gaps.mean
        timed = ingredients.timing and step_gap > 0.0
        chosen: dict[str | None, GapModel] = {}
        keyed_weights, nodes_of, values_of, pending = (
            self._weights,
            self._nodes_of,
            self._values,
            self._pending,
        )
        by_forecast = ingredients.fixed_by_forecast
        # Workflows at the same point share one forecast (one values object): its weights are summed first,
        # and each shared forecast is added to the demand once.
        weight_of_values: dict[int, list] = {}
        for state in self.registry.recent(MAX_FORECAST_WORKFLOWS):
            workflow = state.id
            weight = self._refresh_weight(state, chosen, step_gap) if timed else 1.0
            keyed_weight = keyed_weights.get(workflow)
            if keyed_weight is None or _moved(keyed_weight, weight):
                rising = keyed_weight is not None and weight > keyed_weight
                self._invalidate(nodes_of.get(workflow), rising=rising)
                keyed_weight = weight
            weights[workflow] = keyed_weight
            if by_forecast:  # the parts are kept only where they make the demand (as _set_part keeps them)
                values = values_of.get(workflow, NO_VALUES)
                waiting = pending.get(workflow)
                parts[workflow] = (weight, values, waiting)
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
        for agent in demand.keys() | self._keyed_demand.keys():
            now, then = demand.get(agent, 0.0), self._keyed_demand.get(agent, 0.0)
            if _moved(then, now):
                self._invalidate(self._fixed_nodes.get(agent), rising=now > then)
                then = now
            if agent in demand:
                keyed[agent] = then
        self._weights, self._parts, self._demand, self._keyed_demand = weights, parts, demand, keyed
        self._refresh_every = max(REFRESH_EVERY, len(weights) // REFRESH_SHARE)

    # -- ranking

    def score(self, node: CacheNode, t: NodeTags | None = None) -> float:
        """Expected discounted reads of `node` (the paper's Score, plus the fixed-prompt terms)."""
        t = t if t is not None else tags_of(node)
        if t is None:
            return 0.0
        ingredients = self.ingredients
        fixed = t.fixed_agents if ingredients.fixed_by_forecast else ()
        total = 0.0
        if fixed:
            demand = self._keyed_demand
            for agent in fixed:
                total += demand.get(agent, 0.0)
            if not t.past_fixed:  # every workflow's agents are among `fixed`: a shared prompt, no more
                return total
        current_only, reuse = ingredients.current_paths, ingredients.reuse
        weights, values_of, pending, latest_of, reuse_evidence = (
            self._weights,
            self._values,
            self._pending,
            self.latest,
            self.reuse,
        )
        for workflow, agents in t.workflows.items():
            if fixed and agents.keys() <= fixed:  # valued by the demand above (a shared prompt: most workflows)
                continue
            weight = weights.get(workflow)
            if weight is None:  # not active
                continue
            values = values_of.get(workflow)
            waiting = pending.get(workflow)
            latest = latest_of.get(workflow) or NO_LATEST
            for a, stamp in agents.items():
                if a in fixed:
                    continue
                pair = latest.get(a)
                if pair is not None and pair.stamp == stamp:  # on the pair's latest path
                    if pair.reread >= 0:  # told what the pair's next request reads: the node's share of that
                        tokens = node_tokens(node)
                        read = min(max(pair.reread - (t.depth - tokens), 0), tokens) / tokens if tokens else 0.0
                    else:
                        read = reuse_evidence.share(a, pair.region(t.depth)) if reuse else 1.0
                elif current_only:
                    continue
                else:
                    read = 1.0
                if values:
                    total += weight * values.get(a, 0.0) * read
                if a == waiting:
                    total += read
        return total

    def priority(self, node: CacheNode) -> tuple:
        """The eviction key, kept on the node until something it depends on changes (see REFRESH_EVERY)."""
        if self._arrived:  # a key asked outside an eviction round (SGLang's host tier) counts them too
            self._count_waiting()
        self.keys_asked += 1
        t = getattr(node, TAGS_ATTR, None)
        if t is not None and t.key_epoch == self._epoch and t.key[-1] == node.last_access_time:
            return t.key
        self.keys_computed += 1
        key = self._priority(node, t)
        if t is not None:
            t.key, t.key_epoch = key, self._epoch
        return key

    def _priority(self, node: CacheNode, t: NodeTags | None) -> tuple:
        ing = self.ingredients
        tiered = ing.lifecycle and t is not None and not (ing.fixed_by_forecast and t.fixed_agents)
        if tiered and t is not None and self.is_retired(t):
            return self._retired_key(node, t)
        value = self.score(node, t)
        if ing.evidence and t is not None:
            value *= (t.hits + 1) / (t.hits + 2)
        if tiered and t is not None and ing.retired_evidence and value < self.retired_reads.share_of(t):
            return self._retired_key(node, t)  # its own workflows will read it less than others read retired cache
        if ing.cost and value > 0.0:
            depth = t.depth if t is not None else node_tokens(node)
            value *= self.cost.miss_cost_per_token(depth, node_tokens(node), bool(getattr(node, "backuped", False)))
            value /= self.cost.linear_s
        frequency = self.read_rate(t) if ing.fallback and value == 0.0 and t is not None else 0.0
        return (1, value, frequency, node.last_access_time)

    def _retired_key(self, node: CacheNode, t: NodeTags) -> tuple:
        """The retired tier's order: with `retired_evidence`, generated output no prompt re-sent yet before
        prompts (a later request that re-sends it reads the prompt above it too); with `retired_ages`, the
        value its age says it has (RetiredAges); LRU within."""
        ingredients, ages = self.ingredients, self.retired_ages
        value = 0.0
        if ingredients.retired_ages and ages.learned:
            age = self._now - t.last_access
            value = ages.value(_latest_agents(t), age)
            self._rekey_at(t, t.last_access + ages.bucket_end(age))
        return (0, float(ingredients.retired_evidence and t.in_prompt), value, node.last_access_time)

    def _rekey_at(self, t: NodeTags, when: float) -> None:
        """Schedule `t`'s key to be recomputed at `when` (on the policy clock): its age's value changes then."""
        if t.rekey_at == when:
            return
        if when == math.inf:  # the oldest bucket: its value stays
            t.rekey_at = 0.0
            return
        t.rekey_at = when
        rekeys = self._rekeys
        if len(rekeys) >= MAX_REKEYS:  # drop the entries of nodes evicted or re-keyed since
            rekeys[:] = [e for e in rekeys if e[2].rekey_at == e[0] and not e[2].evicted]
            heapq.heapify(rekeys)
            if len(rekeys) >= MAX_REKEYS:  # that many live retired nodes: each is scheduled again when next keyed
                for _, _, scheduled in rekeys:
                    scheduled.rekey_at = 0.0
                rekeys.clear()
        self._rekey_sequence += 1
        heapq.heappush(rekeys, (when, self._rekey_sequence, t))

    def _rekey_aged(self, now: float) -> None:
        """Report the retired nodes whose age crossed into another bucket: their keys changed."""
        rekeys = self._rekeys
        while rekeys and rekeys[0][0] <= now:
            when, _, t = heapq.heappop(rekeys)
            if t.rekey_at == when:  # else re-keyed since (touched, or a new epoch)
                t.rekey_at = 0.0
                if not t.evicted:
                    self.forget_key(t)

    def _count_retired_reads(self, read: Sequence[Any], workflow: WorkflowKey) -> None:
        """Count the retired nodes a request read from cache, at its first tagging (once its prompt is in the
        tree, where the server tags it before it finishes, or when it finishes): they are on its path, within
        what it matched (`read`), and untouched by it yet. The next tagging finds them its own, so not retired."""
        for node in read:
            t = getattr(node, TAGS_ATTR, None)
            # A node the (active) workflow touched already is its own, not retired: the finish after a
            # checkpoint skips the whole path at one lookup per node.
            if t is not None and workflow not in t.workflows and not t.fixed_agents and self.is_retired(t):
                agents = _latest_agents(t)
                if self.ingredients.retired_evidence:
                    self.retired_reads.read(agents)
                if self.ingredients.retired_ages:
                    self.retired_ages.read(agents, self._now - t.last_access, node_tokens(node))

    def read_rate(self, t: NodeTags) -> float:
        """Reads per second since the node was written (what it has shown, for nodes no forecast values)."""
        return t.hits / (self._now - t.created + self.gaps.mean + 1e-9)


class ReuseEvidence:
    """How much of its previous request's path an agent's next request (in the same workflow) reads again,
    per part of that path: the context it had read from cache, its fresh prompt tokens, its generated
    tokens. Learned per agent from what happens, in tokens, with all agents' shares as the prior; bounded
    in agents (the least recently observed forgotten)."""

    PARTS: Final = (CONTEXT, FRESH, OUTPUT)

    def __init__(self) -> None:
        # agent -> per part, three counts: [tokens read again, tokens, observations]
        self._counts: OrderedDict[str, list[int]] = OrderedDict()
        self._totals = [0] * 9
        # What share() answers from: the counts as of the last freeze() (the policy's keys must not move
        # between two of its epochs unannounced), and how many observations there were then.
        self._frozen_counts: dict[str, list[int]] = {}
        self._frozen_totals = [0] * 9
        self._observations = self._frozen_observations = 0
        self._shares: dict[tuple[str, int], float] = {}  # share() as of the last freeze, as it was asked

    def observe(self, agent: str, previous: Latest, read: Sequence[Any]) -> None:
        """The agent's new request read the nodes `read` from cache (its path, root's child first, within its
        match): how far along the previous request's path did that go? Where the previous path was evicted
        first, nothing is learned (it might have been read)."""
        if previous.matched is None or previous.prompt is None:
            return
        held = {id(node) for node in read}
        # The deepest node the two paths share within the match: walk up the previous path to it.
        node, below = previous.end, None
        while node is not None and id(node) not in held:
            node, below = getattr(node, "parent", None), node
        shared_tags = tags_of(node) if node is not None else None
        shared = shared_tags.depth if shared_tags is not None else 0
        if shared < previous.depth and below is not None:
            t = tags_of(below)
            if t is None or t.evicted:
                return  # the rest of the previous path was gone before the request came
        self._observations += 1
        counts = _agent_counts(self._counts, agent, lambda: [0] * 9)
        # A fixed prompt it computed is not fresh: the demand values it (share() answers 1.0 for it).
        fixed = previous.fixed
        bounds = (fixed, max(fixed, previous.matched), max(fixed, previous.prompt), previous.depth)
        for i, (start, stop) in enumerate(zip(bounds, bounds[1:])):
            if stop <= start:
                continue
            for j, n in enumerate((min(max(shared - start, 0), stop - start), stop - start, 1)):
                counts[3 * i + j] += n
                self._totals[3 * i + j] += n

    def freeze(self) -> None:
        """Answer share() from the evidence seen so far, until the next freeze."""
        self._frozen_counts = {agent: list(counts) for agent, counts in self._counts.items()}
        self._frozen_totals = list(self._totals)
        self._frozen_observations = self._observations
        self._shares = {}

    def doubled(self) -> bool:
        """Whether the observations doubled since the last freeze (early on, evidence is worth freezing often)."""
        return self._observations > 2 * self._frozen_observations

    def share(self, agent: str, part: int) -> float:
        """The share of a node in this part of the agent's latest request its next request reads again
        (1.0 for the fixed prompt: its value comes from every workflow's forecast, not this pair's)."""
        if part not in self.PARTS:
            return 1.0
        key = (agent, part)
        share = self._shares.get(key)  # every key the policy computes asks: answer each once per freeze
        if share is None:
            share = self._shares[key] = self._share(agent, part)
        return share

    def _share(self, agent: str, part: int) -> float:
        i = 3 * (part - CONTEXT)
        read, total, _ = self._frozen_totals[i : i + 3]
        prior = read / total if total else 0.5  # nothing seen yet: either way
        counts = self._frozen_counts.get(agent)
        if counts is None or counts[i + 1] == 0:
            return prior
        read, total, observations = counts[i : i + 3]
        weight = REUSE_PRIOR * total / observations  # the prior counts as REUSE_PRIOR of the agent's observations
        return (read + weight * prior) / (total + weight)


class RetiredReads:
    """How often cache that only ended workflows wrote is read again, per agent that wrote it: reads of
    retired nodes (fixed prompts aside) per node retired. Agent workflows rarely read what another, ended,
    workflow wrote (a fact that outranks an estimate: retired cache goes first); a chat's next turn, a
    workflow of its own, reads its previous turn's. An agent's share starts at 0, as if REUSE_PRIOR of its
    nodes had been retired and never read (no evidence: the paper's rule holds); bounded in agents (the
    least recently counted forgotten)."""

    def __init__(self) -> None:
        self._counts: OrderedDict[str, list[int]] = OrderedDict()  # agent -> [reads, nodes retired]
        self._retired = 0
        # What share() answers from, as of the last freeze(): keys must not move between two of the policy's
        # epochs unannounced.
        self._shares: dict[str, float] = {}
        self._frozen_retired = 0

    def read(self, agents: Iterable[str]) -> None:
        for agent in agents:
            self._count(agent)[0] += 1

    def retired(self, agents: Iterable[str]) -> None:
        self._retired += 1
        for agent in agents:
            self._count(agent)[1] += 1

    def _count(self, agent: str) -> list[int]:
        return _agent_counts(self._counts, agent, lambda: [0, 0])

    def freeze(self) -> None:
        self._shares = {a: r / (n + REUSE_PRIOR) for a, (r, n) in self._counts.items() if r}
        self._frozen_retired = self._retired

    def doubled(self) -> bool:
        """Whether the nodes retired doubled since the last freeze (early on, evidence is worth freezing often)."""
        return self._retired > 2 * self._frozen_retired

    def share(self, agents: Iterable[str]) -> float:
        """Reads per node retired of the agents' retired cache (the most any of them has)."""
        shares = self._shares
        if not shares:  # no retired cache was ever read again: agent workflows
            return 0.0
        return max((shares.get(a, 0.0) for a in agents), default=0.0)

    def share_of(self, t: NodeTags) -> float:
        """share() for the agents of the workflow that touched `t` last (asked for every key computed: where no
        retired cache was ever read again, without looking them up)."""
        return self.share(_latest_agents(t)) if self._shares else 0.0


class RetiredAges:
    """What a retired node's age says it is worth, per agent that wrote it: the chance that a retired node of
    that agent and age is read again before it is evicted, learned from the retired nodes read and evicted
    at each age (EVA's hit probability; Beckmann and Sanchez, "Maximizing Cache Performance Under
    Uncertainty", HPCA 2017).

    LRU evicts the retired node idle longest. Where conversations come back after a pause and more of them
    are live than the cache holds (chat under pressure), that is the node about to be read: every
    conversation is evicted just before its next turn, and none is read again. Ranked by this chance, the
    nodes that outlived the cache's turnover (read for certain once they did) outrank young ones, so some
    conversations stay whole; where returns come soon or never (a cache that holds the live ones), the
    chance falls with age and the order is LRU's. EVA also charges a node its expected remaining lifetime;
    measured on lifetimes the policy itself cuts short, that charge made the oldest nodes (evicted soon
    anyway) look nearly free to keep, and lost 1.3 points on chat at 16x the mean prompt. Evidence is
    counted in tokens by age bucket (half-octaves above AGE_RESOLUTION_S), halved every AGE_HALF_EVENTS
    events; an agent without evidence of its own is valued by every agent's. The chances are frozen at each
    of the policy's refreshes and read by a key when it is computed (its node touched, its age in a new
    bucket, a new epoch). Until a retired node is read again (agent workflows) every value is 0 and the
    tier stays LRU."""

    def __init__(self) -> None:
        # agent -> [tokens read again per age bucket, tokens evicted per age bucket]; least recent first
        self._counts: OrderedDict[str, tuple[list[float], list[float]]] = OrderedDict()
        self._all = ([0.0] * AGE_BUCKETS, [0.0] * AGE_BUCKETS)
        self._events = 0
        self._changed: set[str] = set()  # agents counted since the last freeze
        # What value() answers from, as of the last freeze(): per age bucket, the chance of a read before
        # eviction, per agent and every agent's (None: no read yet).
        self._chances: dict[str, list[float]] = {}
        self._chance: list[float] | None = None

    @property
    def learned(self) -> bool:
        """Whether some retired node was read again (before the last freeze): else every value is 0."""
        return self._chance is not None

    @staticmethod
    def bucket(age: float) -> int:
        return min(AGE_BUCKETS - 1, int(2.0 * math.log2(1.0 + max(0.0, age) / AGE_RESOLUTION_S)))

    @classmethod
    def bucket_end(cls, age: float) -> float:
        """The age at which `age`'s bucket ends (infinite for the last)."""
        b = cls.bucket(age)
        return math.inf if b == AGE_BUCKETS - 1 else AGE_RESOLUTION_S * (2.0 ** ((b + 1) / 2.0) - 1.0)

    def read(self, agents: Iterable[str], age: float, tokens: int) -> None:
        self._count(0, agents, age, tokens)

    def evicted(self, agents: Iterable[str], age: float, tokens: int) -> None:
        self._count(1, agents, age, tokens)

    def _count(self, kind: int, agents: Iterable[str], age: float, tokens: int) -> None:
        b = self.bucket(age)
        self._all[kind][b] += tokens
        for agent in agents:
            counts = _agent_counts(self._counts, agent, lambda: ([0.0] * AGE_BUCKETS, [0.0] * AGE_BUCKETS))
            counts[kind][b] += tokens
            self._changed.add(agent)
        self._events += 1
        if self._events % AGE_HALF_EVENTS == 0:  # halving moves no chance: only the weight of what comes next
            for reads, evictions in (self._all, *self._counts.values()):
                for i in range(AGE_BUCKETS):
                    reads[i] *= 0.5
                    evictions[i] *= 0.5

    def freeze(self) -> None:
        """Recompute the chances of every agent counted since the last freeze, and every agent's."""
        if not any(self._all[0]):
            self._chance, self._chances = None, {}
            self._changed.clear()
            return
        self._chance = _read_chances(*self._all)
        chances, counts = self._chances, self._counts
        for agent in self._changed:
            agent_counts = counts.get(agent)
            if agent_counts is not None:
                chances[agent] = _read_chances(*agent_counts)
        if len(chances) > len(counts):  # agents forgotten by the counts
            self._chances = {agent: chances[agent] for agent in counts if agent in chances}
        self._changed.clear()

    def value(self, agents: Iterable[str], age: float) -> float:
        """The chance that a retired node of `agents` at `age` is read before it is evicted (the most any of
        them gives; every agent's for an agent without evidence of its own)."""
        chance = self._chance
        if chance is None:
            return 0.0
        b, chances = self.bucket(age), self._chances
        return max((chances.get(agent, chance)[b] for agent in agents), default=chance[b])


def _read_chances(reads: list[float], evictions: list[float]) -> list[float]:
    """Per age bucket, the share of the tokens that reached that age which were read before eviction. A
    bucket no token reached takes the next older one's (0 past the oldest)."""
    chances = [0.0] * AGE_BUCKETS
    read_after = ended_after = chance = 0.0
    for b in range(AGE_BUCKETS - 1, -1, -1):
        read_after += reads[b]
        ended_after += reads[b] + evictions[b]
        if ended_after > 0.0:
            chance = read_after / ended_after
        chances[b] = chance
    return chances


def _agent_counts(counts: OrderedDict[str, Any], agent: str, new: Callable[[], Any]) -> Any:
    """`agent`'s entry of per-agent `counts`, made with `new` where missing; the least recently counted agent
    is forgotten past MAX_REUSE_AGENTS."""
    entry = counts.get(agent)
    if entry is None:
        entry = counts[agent] = new()
        if len(counts) > MAX_REUSE_AGENTS:
            counts.popitem(last=False)
    else:
        counts.move_to_end(agent)
    return entry


def _read_from_cache(path: Sequence[Any], matched_tokens: int | None) -> Sequence[Any]:
    """The nodes of a request's `path` within the `matched_tokens` it found cached; all of them while it runs
    (None: its match is not final yet)."""
    if matched_tokens is None:
        return path
    depth = 0
    for i, node in enumerate(path):
        t = getattr(node, TAGS_ATTR, None)
        depth = t.depth if t is not None else depth + node_tokens(node)  # a tagged node keeps its depth
        if depth > matched_tokens:
            return path[:i]
    return path


def _latest_agents(t: NodeTags) -> Iterable[str]:
    """The agents of the workflow that touched `t` last."""
    return next(reversed(t.workflows.values()), ())


def _fallen(
    before: tuple[float, dict[str, float], str | None], after: tuple[float, dict[str, float], str | None]
) -> set[str]:
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


def _moved(old: float | None, new: float | None) -> bool:
    """Whether a value changed by more than CHANGE of itself (appearing or disappearing counts)."""
    if old is None or new is None:
        return old is not new
    # abs() and max() spelled out: this runs for every workflow at every refresh.
    larger = new if new >= 0.0 else -new
    other = old if old >= 0.0 else -old
    if other > larger:
        larger = other
    return (new - old if new > old else old - new) > CHANGE * larger


def _ewma(mean: float, sample: float, alpha: float = 0.05) -> float:
    return sample if mean == 0.0 else (1.0 - alpha) * mean + alpha * sample
