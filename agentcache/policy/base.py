"""What every eviction policy shares: the policy base class, which keeps the workflow registry and node tags.

The policy's per-node bookkeeping and its view of the engine's nodes are in agentcache.policy.nodes. An
adapter (the SGLang plugin, the replay benchmark) does these things:

1. ``policy.on_request(tags, now)`` when a tagged request arrives;
2. ``policy.on_admit(tags)`` when the engine admits it (holds its matched prefix);
3. ``policy.tag_path(nodes, tags, now, matched_tokens, prompt_tokens)`` with the
   radix path the request matched and inserted, root first: once its prompt is
   computed (``matched_tokens`` None: the engine may share it from then on) and
   when it finishes (the tokens it matched, and its prompt's length);
4. ``policy.on_release(tags, now)`` once the request has finished, been refused or been aborted (its
   workflow's lease does not run out while it is in flight);
5. ``policy.on_end(workflow, now)`` on a workflow's end event;
6. ``policy.on_tool_start(workflow, agent, tool, now)`` and ``policy.on_tool_end(...)`` when an agent's tool
   call begins and ends (its next call comes after the end), kept in ``policy.pauses``; a policy that does
   not hear them (``hears_tools`` False) behaves as if no tool event came;
7. what the app's framework knows, as it tells it: ``policy.on_plan(app, plan, now)`` (an app's plan),
   ``policy.on_next(workflow, agents, now)`` (the agents that make the workflow's next call) and
   ``policy.on_agent_done(workflow, agent, now)`` (the agent's context there will not be read again);
8. ``policy.priority(node)`` as the engine's eviction key (smallest first).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

from mypy_extensions import mypyc_attr

from agentcache.policy.nodes import (
    MAX_AGENTS_PER_WORKFLOW,
    MAX_FIXED_AGENTS_PER_NODE,
    MAX_TRACKED_AGENTS,
    MAX_WORKFLOWS_PER_NODE,
    CacheNode,
    Latest,
    NodeClass,
    NodeTags,
    ensure_tags,
    node_tokens,
    tags_of,
)
from agentcache.policy.pauses import Pauses
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor.base import AgentCoverage
from agentcache.tags import Tags, WorkflowKey
from agentcache.trace.model import Plan


def _keep_latest(
    entries: dict[str, Any], stamped: list[tuple[int, str]], cap: int = MAX_AGENTS_PER_WORKFLOW
) -> list[tuple[str, Any]]:
    """Drop from `entries` (agent -> anything) the least recently tagged agents, by their `stamped` (stamp,
    agent) pairs (ties by name), down to three quarters of `cap`; the entries dropped."""
    stamped.sort()
    return [(a, entries.pop(a)) for _, a in stamped[: len(stamped) - cap * 3 // 4]]


# Compiled with mypyc (agentcache.compiled), subclassed by the policies that are not.
@mypyc_attr(allow_interpreted_subclasses=True)
class CachePolicy(ABC):
    """Base class: keeps the workflow registry and node tags current; subclasses rank nodes."""

    name: ClassVar[str]
    # Whether priority() keeps each node's key until it changes (the node's own last_access_time aside, which
    # only grows), and take_changed_keys() says which changed: the engine then keeps its eviction heap across
    # eviction rounds and re-keys only those nodes (agentcache.engine.heap.EvictionHeap).
    keeps_keys: ClassVar[bool] = False

    def __init__(self, registry: WorkflowRegistry | None = None):
        self.registry = registry if registry is not None else WorkflowRegistry()
        # Each active (workflow, agent)'s latest request: its number, the deepest node of its path and the
        # node its prompt ends at. A node tagged by the pair with an older number is off the pair's current
        # path (the pair's history went another way since: rewritten, truncated, or another branch), and
        # the end of the current path is what a prefetch loads back for the pair's next call.
        self.latest: dict[WorkflowKey, dict[str, Latest]] = {}
        self.fixed_leaf: dict[str, Any] = {}  # agent -> deepest node of its fixed prompt
        self._requests_tagged = 0
        # The replay's oracle sets this before each request it serves: what the request's pair reads of its path
        # next (-1: not told, as on a server).
        self.told_reread = -1
        self.pauses = Pauses(self.registry, self.on_pause)  # open tool pauses, and each (agent, tool)'s durations
        self.hears_tools = True

    # -- events from the adapter

    def on_request(self, tags: Tags, now: float) -> WorkflowState:
        self.expire(now)
        state, previous = self.registry.observe(tags.key, tags.identity, now)
        if self.pauses.open or self.pauses.returned:
            self.pauses.request(state.id, tags.identity, now)  # its call ends its pause
        self.on_transition(state, previous)
        return state

    def expire(self, now: float) -> int:
        """Retire every workflow whose lease ran out by `now` (pauses past their cut-off cut first); how many did."""
        if self.pauses.holding:
            self.pauses.cut(now)
        expired = self.registry.expire(now)
        for state in expired:
            self._retire(state)
        return len(expired)

    def on_admit(self, tags: Tags) -> None:
        """The engine admitted the request `tags` came with: its matched prefix is held until it finishes."""

    def on_release(self, tags: Tags, now: float) -> None:
        """The request `tags` came with is over (finished, refused or aborted): its workflow holds it no more."""
        self.registry.release(tags.key, now)

    def on_end(self, workflow: WorkflowKey, now: float) -> bool:
        """Apply an end event; False when the workflow was not active."""
        state = self.registry.end(workflow)
        if state is None:
            return False
        self._retire(state)
        return True

    def on_tool_start(self, workflow: WorkflowKey, agent: str, tool: str, now: float) -> None:
        """`agent` (an identity, as `Tags.identity`) of `workflow` called `tool` and waits on it: its next call
        re-sends its latest path. A workflow that is not active has nothing to keep: ignored."""
        if self.hears_tools:
            self.pauses.start(workflow, agent, tool, now)

    def on_tool_end(self, workflow: WorkflowKey, agent: str, tool: str, now: float) -> None:
        """`agent`'s call of `tool` returned (a start may have gone unheard, and a hung tool's end never comes)."""
        if self.hears_tools:
            self.pauses.end(workflow, agent, tool, now)

    def on_plan(self, app: str, plan: Plan, now: float) -> None:
        """The framework of `app` (an identity, as `Tags.app` scoped like `Tags.identity`) told its plan: what it
        knows of the app's workflows before they run. A policy that does not use it ignores it."""

    def on_next(self, workflow: WorkflowKey, agents: tuple[str, ...], now: float) -> None:
        """The framework decided that one of `agents` (identities) makes `workflow`'s next call."""

    def on_agent_done(self, workflow: WorkflowKey, agent: str, now: float) -> None:
        """`agent`'s context in `workflow` will not be read again (a phase or task done, a known last turn)."""

    def pause_counts(self) -> dict[str, int]:
        """`{"open": n, "cut_off": m}`: tool pauses open within their cut-off now, and pauses cut off so far."""
        return self.pauses.counts()

    def _retire(self, state: WorkflowState) -> None:
        self.latest.pop(state.id, None)
        self.pauses.drop(state.id)
        self.on_workflow_retired(state)

    def tag_path(
        self,
        path: Sequence[Any],
        tags: Tags,
        now: float,
        matched_tokens: int | None,
        prompt_tokens: int | None = None,
    ) -> None:
        """Record that the request `tags` used every node of `path` (root's child first).

        `matched_tokens` is None while the request runs (its prompt just entered the tree), and the
        tokens it found cached once it finished; `prompt_tokens` is its prompt's length then.
        """
        self._requests_tagged += 1
        stamp = self._requests_tagged
        workflow, agent, fixed = tags.key, tags.identity, tags.fixed
        finished = matched_tokens is not None
        matched = matched_tokens or 0
        depth = 0
        for node in path:
            depth += node_tokens(node)
            t = ensure_tags(node, now)
            t.evicted = False  # a path being tagged is on the device
            agents = t.workflows.pop(workflow, None)  # re-inserted last: most recent workflows last
            if agents is None:
                if len(t.workflows) >= MAX_WORKFLOWS_PER_NODE:
                    self._prune(t)
                agents = {}
            elif agent not in agents and len(agents) >= MAX_AGENTS_PER_WORKFLOW:
                _keep_latest(agents, [(s, a) for a, s in agents.items()])
            agents[agent] = stamp
            t.workflows[workflow] = agents
            if depth <= fixed:
                if agent not in t.fixed_agents and len(t.fixed_agents) >= MAX_FIXED_AGENTS_PER_NODE:
                    self._prune_fixed(t)
                t.fixed_agents.add(agent)
            else:
                t.past_fixed = True
            if finished and depth <= matched:
                t.hits += 1
                if depth == matched:
                    t.stops += 1
            if prompt_tokens is None or depth <= prompt_tokens:
                t.in_prompt = True
            t.last_access = now
            t.depth = depth
            if depth <= fixed:
                self.fixed_leaf.pop(agent, None)  # re-insert: most recently used agents last
                self.fixed_leaf[agent] = node
                if len(self.fixed_leaf) > MAX_TRACKED_AGENTS:
                    del self.fixed_leaf[next(iter(self.fixed_leaf))]
        if path and self.registry.is_active(workflow):
            latest = Latest(stamp, path[-1], fixed, matched_tokens, prompt_tokens, depth, self.told_reread)
            pairs = self.latest.setdefault(workflow, {})
            if agent not in pairs and len(pairs) >= MAX_AGENTS_PER_WORKFLOW:
                for gone, pair in _keep_latest(pairs, [(p.stamp, a) for a, p in pairs.items()]):
                    self.on_latest_dropped(workflow, gone, pair)
            pairs[agent] = latest

    def _prune(self, t: NodeTags) -> None:
        """Forget the ended workflows on a full node, then its least recent ones down to three quarters full:
        a prefix that every workflow shares is pruned once per MAX_WORKFLOWS_PER_NODE / 4 new workflows at
        most, not at each."""
        for workflow in [w for w in t.workflows if not self.registry.is_active(w)]:
            del t.workflows[workflow]
        while len(t.workflows) > MAX_WORKFLOWS_PER_NODE * 3 // 4:
            del t.workflows[next(iter(t.workflows))]

    def _prune_fixed(self, t: NodeTags) -> None:
        """Forget the least recently tagged of a full node's fixed-prompt agents, by the stamps its workflows
        remember (agents none remembers first), down to three quarters full."""
        seen: dict[str, int] = dict.fromkeys(t.fixed_agents, 0)
        for agents in t.workflows.values():
            for a, stamp in agents.items():
                if stamp > seen.get(a, stamp):
                    seen[a] = stamp
        for a, _ in _keep_latest(seen, [(stamp, a) for a, stamp in seen.items()], MAX_FIXED_AGENTS_PER_NODE):
            t.fixed_agents.discard(a)

    # -- hooks for subclasses

    def on_transition(self, state: WorkflowState, previous: str | None) -> None:
        """A workflow moved from `previous` (None: its first request) to ``state.agent``."""

    def on_workflow_retired(self, state: WorkflowState) -> None:
        """A workflow ended or its lease ran out."""

    def on_pause(self, workflow: WorkflowKey, now: float) -> None:
        """A tool pause of the (active) workflow began, ended or was cut off at `now` (see ``pauses``)."""

    def on_latest_dropped(self, workflow: WorkflowKey, agent: str, latest: Latest) -> None:
        """The pair's `latest` path was forgotten (MAX_AGENTS_PER_WORKFLOW): its nodes are on no latest path."""

    def adopt(self, tags: NodeTags) -> None:
        """The engine split a node: `tags` (a copy of the child's) now belong to the new parent."""

    def on_evicted(self, t: NodeTags, tokens: int, node_class: str) -> None:
        """The engine evicted `tokens` tokens of `t`'s node from the device; `classify` put it in `node_class`."""

    def coverages(self) -> list[AgentCoverage]:
        """The forecasters the policy consults, each counting its forecasts and the agents it knew."""
        return []

    def forecast_stats(self) -> dict[str, dict]:
        return {c.forecaster: c.to_json() for c in self.coverages()}

    # -- ranking

    def forget_key(self, t: NodeTags) -> None:
        """What the key of `t`'s node depends on changed (the engine split it): a policy that keeps keys
        recomputes it at its next use."""

    def take_changed_keys(self) -> list[NodeTags] | None:
        """The nodes whose key may have changed since the last call (repeats possible); None when any may
        have (the engine then re-keys every leaf), as always for a policy that keeps no keys."""
        return None

    @abstractmethod
    def priority(self, node: CacheNode) -> tuple:
        """Eviction key: the smallest is evicted first."""

    # -- shared helpers

    def active_workflows_of(self, t: NodeTags) -> list[tuple[WorkflowState, dict[str, int]]]:
        get = self.registry.get
        out = []
        for workflow, agents in t.workflows.items():
            state = get(workflow)
            if state is not None:
                out.append((state, agents))
        return out

    def is_retired(self, t: NodeTags | None) -> bool:
        """Touched by tagged requests, and none of their workflows is still active."""
        if t is None or not t.workflows:
            return t is not None
        # Most recent last: the likeliest active (asked for every key computed).
        active = self.registry.by_id
        for workflow in reversed(t.workflows):
            if workflow in active:
                return False
        return True

    def classify(self, node: CacheNode) -> str:
        t = tags_of(node)
        if t is None:
            return NodeClass.UNTAGGED
        if self.is_retired(t):
            return NodeClass.RETIRED
        return NodeClass.FIXED if t.fixed_agents else NodeClass.HISTORY
