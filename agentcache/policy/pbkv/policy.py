"""PBKVPolicy: the events the engine reports, each handed to the part of the policy that keeps what it changes.

The parts: the forecasts (forecasts.py), the timing weights (timing.py), the demand (demand.py), the reuse and
retired-cache evidence (reuse.py, retired.py), the kept eviction keys (keys.py), and the key computed from
them all (score.py). Keys are kept on the nodes and recomputed only when something they read changed. What
changes with time alone (how soon each workflow calls again, the arrival rate) is refreshed every
REFRESH_EVERY requests, or every REFRESH_SHARE of the workflows a refresh visits where that is more (a refresh
costs one step per workflow: its cost per request stays bounded however many are open), and a workflow's
nodes or a fixed prompt recomputed where that moved its value by more than demand.CHANGE; every key is
recomputed every EPOCH_REFRESHES refreshes (what drifts slowly: the reuse shares, read rates). A workflow's
own requests update its values at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentcache.cost import DEFAULT_COST, CostModel
from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import NO_LATEST, TAGS_ATTR, CacheNode, Latest, NodeClass, NodeTags, node_tokens
from agentcache.policy.pbkv.demand import Demand
from agentcache.policy.pbkv.forecasts import Forecasts
from agentcache.policy.pbkv.hints import Hints
from agentcache.policy.pbkv.ingredients import DEFAULT, Ingredients, default_forecaster
from agentcache.policy.pbkv.keys import EvictionKeys
from agentcache.policy.pbkv.retired import RetiredAges, RetiredReads, latest_agents
from agentcache.policy.pbkv.reuse import ReuseEvidence, read_from_cache
from agentcache.policy.pbkv.score import Ranking
from agentcache.policy.pbkv.timing import Timing
from agentcache.policy.prefetch import Candidate
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor import Predictor
from agentcache.predictor.base import AgentCoverage
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace.model import Plan

REFRESH_EVERY = 16
REFRESH_SHARE = 4
EPOCH_REFRESHES = 8


class PBKVPolicy(CachePolicy):
    name = "pbkv"
    keeps_keys = True

    def __init__(
        self,
        registry: WorkflowRegistry | None = None,
        predictor: Predictor | None = None,
        gamma: float = 0.8,
        ingredients: Ingredients = DEFAULT,
        cost: CostModel = DEFAULT_COST,
        predictor_budget_ms: float | None = None,
    ):
        super().__init__(registry)
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma}")
        self.ingredients = ingredients
        # Default forecaster: online Markov over the last DEFAULT_ORDER agents, backing off to shorter
        # contexts where data is thin (history-dependent exits such as retry caps need the longer ones).
        chosen = predictor if predictor is not None else default_forecaster()
        self.forecasts = Forecasts(chosen, gamma, predictor_budget_ms)
        self.predictor = self.forecasts.predictor
        self.hears_tools = ingredients.tools  # else as if no tool event came
        self.timing = Timing(gamma, ingredients.timing, self.pauses if ingredients.tools else None, self.latest)
        self.keys = EvictionKeys(ingredients)
        self.demand = Demand(ingredients, self.registry, self.timing, self.forecasts, self.keys)
        self.hints = Hints(self.registry, self.timing, self.forecasts, self.demand, self.keys, self.pauses, self.latest)
        self.reuse = ReuseEvidence()
        self.retired_reads = RetiredReads()
        self.retired_ages = RetiredAges()
        self.ranking = Ranking(
            self,
            ingredients,
            cost,
            self.timing,
            self.forecasts,
            self.demand,
            self.keys,
            self.reuse,
            self.retired_reads,
            self.retired_ages,
            self.hints,
        )
        self._refreshes = 0
        self._refresh_every = REFRESH_EVERY
        self._since_refresh = REFRESH_EVERY  # refresh at the first request
        self._weighed_at = 0.0  # the policy clock when the timing weights were last computed, and requests since
        self._since_weighed = 0
        # The work done, for benchmarks and tests (the compiled policy's methods cannot be wrapped to count it):
        # eviction keys asked for and those computed (the rest were kept).
        self.keys_asked = self.keys_computed = 0
        # workflow -> agent -> the pair's previous request, while its running request's prompt is in the tree
        # (SGLang tags it there before it finishes, and that tagging makes it the pair's latest): what the
        # finish compares the request's read with, to learn the agent's reuse.
        self._before_running: dict[WorkflowKey, dict[str, Latest]] = {}

    # -- events from the engine

    def on_request(self, tags: Tags, now: float) -> WorkflowState:
        self.timing.now = now
        if self.keys.rekeys:
            self.keys.rekey_aged(now)
        self._since_refresh += 1
        self._since_weighed += 1
        if self._since_refresh >= self._refresh_every:
            self._refresh()
        elif self._weights_aged(now):
            self._weigh()
        known = self.registry.get(tags.key)
        self.timing.observe(known, now)
        if self.hints.heard(tags, known is None):  # an agent whose paths were done calls again: valued again
            self.keys.invalidate(self.keys.nodes_of.get(tags.key))
        state = super().on_request(tags, now)
        if self.ingredients.pending:
            self.demand.arrive(state, tags.identity)
        self.demand.update(state)
        return state

    def on_admit(self, tags: Tags) -> None:
        self.demand.admit(tags)

    def on_release(self, tags: Tags, now: float) -> None:
        super().on_release(tags, now)
        self.demand.admit(tags)  # one aborted in the queue waits no more either: no certain read of its agent

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
            read = read_from_cache(path, matched_tokens)
            if counts_retired_reads:
                self._count_retired_reads(read, workflow)
            if previous is not None:
                self.reuse.observe(agent, previous, read)
        super().tag_path(path, tags, now, matched_tokens, prompt_tokens)
        self.on_admit(tags)  # served, in case its admission went unreported
        if superseded is not None:  # the pair's current path moved: its old one's nodes lose the pair's value
            self.keys.forget_superseded(workflow, agent, superseded.stamp)
        self.keys.track(path, workflow, agent, self.registry.is_active(workflow))

    def on_latest_dropped(self, workflow: WorkflowKey, agent: str, latest: Latest) -> None:
        self.keys.forget_superseded(workflow, agent, latest.stamp)  # its nodes lose the pair's value

    def adopt(self, tags: NodeTags) -> None:
        self.keys.adopt(tags)

    def on_evicted(self, t: NodeTags, tokens: int, node_class: str) -> None:
        if self.ingredients.retired_ages and node_class == NodeClass.RETIRED and not t.fixed_agents:
            ages = self.retired_ages
            ages.evicted(latest_agents(t), (self.timing.now - t.last_access) / ages.age_unit(t), tokens, t.stops)

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        self.forecasts.moved(state, self.hints.prior_of.get(state.id) if self.hints.prior_of else None)
        if state.id in self.pauses.open or state.id in self.pauses.returned:  # another agent of it still waits
            self.forecasts.paused(state.id, self.pauses.waiting(state.id))

    def on_pause(self, workflow: WorkflowKey, now: float) -> None:
        """While an agent waits on a tool (or is back from one) its workflow's next caller is that agent, due when
        the tool returns (Forecasts.paused, Timing): its path keeps its value by how soon that is."""
        state = self.registry.get(workflow)
        if state is None:
            return
        if now > self.timing.now:
            self.timing.now = now
        self.forecasts.paused(workflow, self.pauses.waiting(workflow))
        self.demand.update(state)

    def on_plan(self, app: str, plan: Plan, now: float) -> None:
        if self.ingredients.plan:
            self.hints.plan(app, plan, self.predictor.horizon)

    def on_next(self, workflow: WorkflowKey, agents: tuple[str, ...], now: float) -> None:
        if self.ingredients.plan:
            self.hints.told_next(workflow, agents, now)

    def on_agent_done(self, workflow: WorkflowKey, agent: str, now: float) -> None:
        if self.ingredients.plan:
            self.hints.agent_done(workflow, agent)

    def on_workflow_retired(self, state: WorkflowState) -> None:
        self.hints.retired(state.id)
        self.forecasts.ended(state)
        self.demand.ended(state.id)
        self._before_running.pop(state.id, None)
        nodes = self.keys.nodes_of.pop(state.id, None)
        if nodes and self.ingredients.retired_evidence:
            for t in nodes.values():
                if not t.evicted and not t.fixed_agents and self.is_retired(t):
                    self.retired_reads.retired(t.workflows.get(state.id, ()))
        self.keys.invalidate(nodes)  # its nodes may be retired now

    def _count_retired_reads(self, read: Sequence[Any], workflow: WorkflowKey) -> None:
        """Count the retired nodes a request read from cache, at its first tagging (once its prompt is in the
        tree, where the server tags it before it finishes, or when it finishes): they are on its path, within
        what it matched (`read`), and untouched by it yet. The next tagging finds them its own, so not retired."""
        for node in read:
            t = getattr(node, TAGS_ATTR, None)
            # A node the (active) workflow touched already is its own, not retired: the finish after a
            # checkpoint skips the whole path at one lookup per node.
            if t is not None and workflow not in t.workflows and not t.fixed_agents and self.is_retired(t):
                agents = latest_agents(t)
                if self.ingredients.retired_evidence:
                    self.retired_reads.read(agents)
                if self.ingredients.retired_ages:
                    ages = self.retired_ages
                    ages.read(agents, (self.timing.now - t.last_access) / ages.age_unit(t), node_tokens(node), t.stops)

    def _refresh(self) -> None:
        """Recompute what changes with time alone (Demand.refresh); every key at a new epoch, with the evidence
        frozen again."""
        self._since_refresh = 0
        self._refreshes += 1
        if self._refreshes % EPOCH_REFRESHES == 0 or self.reuse.doubled() or self.retired_reads.doubled():
            self.keys.new_epoch()
            self.reuse.freeze()
            self.retired_reads.freeze()
        if self.ingredients.retired_ages:
            self.retired_ages.freeze()
        self._weigh()
        self._refresh_every = max(REFRESH_EVERY, len(self.demand.weights) // REFRESH_SHARE)

    def _weigh(self) -> None:
        self.demand.refresh()
        self._weighed_at = self.timing.now
        self._since_weighed = 0

    def _weights_aged(self, now: float) -> bool:
        """Whether the timing weights are a step old (the mean gap between a workflow's requests): how soon each
        workflow calls moves by about a step's discount in that time, however few requests came. At most once
        per REFRESH_SHARE-th of the open workflows in requests, as a refresh: one step per workflow each."""
        step = self.timing.gaps.mean
        return (
            self.ingredients.timing
            and 0.0 < step <= now - self._weighed_at
            and self._since_weighed * REFRESH_SHARE >= len(self.demand.weights)
        )

    # -- what the engine asks

    def priority(self, node: CacheNode) -> tuple:
        """The eviction key, kept on the node until something it depends on changes (see REFRESH_EVERY)."""
        if self.demand.arrived:  # a key asked outside an eviction round (SGLang's host tier) counts them too
            self.demand.count_waiting()
        self.keys_asked += 1
        t = getattr(node, TAGS_ATTR, None)
        if t is not None:
            kept = self.keys.current(t, node.last_access_time)
            if kept is not None:
                return kept
        self.keys_computed += 1
        key = self.ranking.key(node, t)
        if t is not None:
            self.keys.keep(t, key)
        return key

    def forget_key(self, t: NodeTags) -> None:
        self.keys.forget(t)

    def take_changed_keys(self) -> list[NodeTags] | None:
        if self.demand.arrived:  # an eviction round starts: requests still waiting are pending now
            self.demand.count_waiting()
        changed = self.keys.take_changed()
        return changed if self.keeps_keys else None

    def coverages(self) -> list[AgentCoverage]:
        return [self.predictor.coverage, self.hints.coverage] if self.hints.priors else [self.predictor.coverage]

    def prefetch_candidates(self) -> list[Candidate]:
        """Each active workflow's history for its likely next agent, and those agents' fixed prompts,
        valued by the probability of being read at the very next step (PBKV's one-step reuse value). A workflow
        whose agent waits on a tool calls that agent next, for certain, when the tool returns: its path is
        worth how soon that is (Timing.pause_weight), so a long pause's path, gone to the host tier, comes
        back as the tool's predicted end nears, not while it is far."""
        out = []
        next_callers: dict[str, float] = {}
        for workflow, row in self.forecasts.next.items():
            latest = self.latest.get(workflow, NO_LATEST)
            soon = self.timing.pause_weight(workflow)
            if soon >= 0.0:
                row = dict.fromkeys(self.pauses.waiting(workflow), soon)
            for agent, p in row.items():
                next_callers[agent] = next_callers.get(agent, 0.0) + p
                if agent in latest:
                    out.append(Candidate(latest[agent].end, p))
        for agent, p in next_callers.items():
            node = self.fixed_leaf.get(agent)
            if node is not None:
                out.append(Candidate(node, p, fixed_agent=agent))
        return out
