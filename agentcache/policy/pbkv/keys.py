"""pbkv's eviction keys, kept across SGLang's eviction rounds: which are current, which changed, when to re-key.

SGLang asks for the key of every evictable leaf at every eviction, so a key is kept until something it depends
on changes: its node was used, a workflow it reads moved on, a fixed prompt's demand changed, its retired
node's age entered another bucket. :class:`EvictionKeys` tracks which nodes' keys read which workflow or
agent, forgets the keys whose inputs changed, and tells the engine's eviction heap
(agentcache.engine.heap.EvictionHeap) which nodes to re-key. A key is current while it was computed in the
current epoch and not forgotten since; a new epoch (pbkv's refresh starts one) forgets every key at once.

Each node's kept key lives in one slot of its tags (``NodeTags.kept``, a :class:`KeptKey` made here the first
time the node's key is kept or forgotten): the engine hands the policy a node, and reading its key there costs
no lookup. Only this module reads or writes that slot.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import Any

from agentcache.policy.kept_key import KeptKey
from agentcache.policy.nodes import MAX_TRACKED_AGENTS, TAGS_ATTR, NodeTags
from agentcache.policy.pbkv.ingredients import Ingredients
from agentcache.tags import WorkflowKey

# KeptKey.epoch of a key forgotten since it was last computed: reported to the engine (FORGOTTEN) or, where
# it can only have grown, not (RISEN).
FORGOTTEN, RISEN = -2, -3
# Changed keys remembered for the engine between two eviction rounds; past this the engine re-keys every leaf
# instead (bounded memory when nothing evicts for a long while).
MAX_CHANGED_KEYS = 65_536
MAX_REKEYS = 1 << 16  # scheduled re-keys kept before the stale ones are dropped


def kept_of(t: NodeTags) -> KeptKey:
    kept = t.kept
    if kept is None:
        kept = t.kept = KeptKey()
    return kept


class EvictionKeys:
    """The kept keys' epoch, the changed keys the engine has not re-keyed yet, the re-keys scheduled by age, and
    which nodes' keys read each active workflow and each agent's fixed-prompt demand."""

    def __init__(self, ingredients: Ingredients) -> None:
        self.epoch = 0
        self._changed: list[NodeTags] = []
        self._all_changed = True
        # (policy clock, sequence, tags): when a retired node's key changes with its age alone (RetiredAges)
        self.rekeys: list[tuple[float, int, NodeTags]] = []
        self._rekey_sequence = 0
        # active workflow -> the nodes it touched whose keys read it (a fixed prompt's read the demand alone)
        self.nodes_of: dict[WorkflowKey, dict[int, NodeTags]] = {}
        self.fixed_nodes: dict[str, dict[int, NodeTags]] = {}  # agent -> nodes of its fixed prompt
        self._by_forecast = ingredients.fixed_by_forecast
        self._cost = ingredients.cost

    # -- the kept keys

    def current(self, t: NodeTags, last_access: float) -> tuple | None:
        """`t`'s node's kept key, where it is current (computed this epoch, its node not used since)."""
        kept = t.kept
        if kept is None or kept.epoch != self.epoch:
            return None
        key = kept.key
        return key if key is not None and key[-1] == last_access else None

    def keep(self, t: NodeTags, key: tuple) -> None:
        kept = kept_of(t)
        kept.key, kept.epoch = key, self.epoch

    def forget(self, t: NodeTags) -> None:
        """What the key of `t`'s node depends on changed: recompute it at its next use, and report it to the
        engine's heap. (A key that can only have grown is marked RISEN instead, unreported: the heap finds out
        when the node reaches its top.)"""
        kept = kept_of(t)
        if kept.epoch == FORGOTTEN:  # already reported since its key was last computed
            return
        kept.epoch = FORGOTTEN
        if not self._all_changed:
            self._changed.append(t)
            if len(self._changed) > MAX_CHANGED_KEYS:
                self.forget_all()

    def forget_all(self) -> None:
        self._all_changed = True
        self._changed = []

    def new_epoch(self) -> None:
        """Every key is computed again at its next use (and every leaf re-keyed by the engine)."""
        self.epoch += 1
        self.forget_all()

    def take_changed(self) -> list[NodeTags] | None:
        """The nodes whose key may have changed since the last call (repeats possible); None when any may have
        (the engine then re-keys every leaf)."""
        if self._all_changed:
            self._all_changed = False
            self._changed = []
            return None
        changed, self._changed = self._changed, []
        return changed

    # -- which keys read what

    def track(self, path: Sequence[Any], workflow: WorkflowKey, agent: str, active: bool) -> None:
        """A request of (`workflow`, `agent`) tagged `path`: forget its nodes' keys, and note which read the
        workflow (while it is `active`) and which the agent's fixed-prompt demand."""
        mine = self.nodes_of.setdefault(workflow, {}) if active else None
        fixed_nodes = None
        for node in path:
            t = getattr(node, TAGS_ATTR, None)
            if t is None:
                continue
            if t.kept is None or t.kept.epoch != FORGOTTEN:  # most were, as the workflow's nodes, just before
                self.forget(t)
            if mine is not None and self.keyed_by_workflows(t):
                mine[id(t)] = t
            if agent in t.fixed_agents:
                if fixed_nodes is None:
                    fixed_nodes = self.fixed_nodes_of(agent)
                fixed_nodes[id(t)] = t

    def forget_superseded(self, workflow: WorkflowKey, agent: str, stamp: int) -> None:
        """Forget the keys of the workflow's nodes still stamped by the pair's superseded request: the ones its new
        path does not pass (tagging re-stamped those it does). Where SGLang tagged the request's prompt before
        it finished, its finish supersedes that tagging and passes every node of it: none."""
        nodes = self.nodes_of.get(workflow)
        if not nodes:
            return
        for t in nodes.values():
            agents = t.workflows.get(workflow)
            if agents is not None and agents.get(agent) == stamp and not t.evicted:
                if t.kept is None or t.kept.epoch != FORGOTTEN:
                    self.forget(t)

    def adopt(self, tags: NodeTags) -> None:
        """The engine split a node: its new parent's `tags` read what the child's did."""
        if self.keyed_by_workflows(tags):
            for workflow in tags.workflows:
                mine = self.nodes_of.get(workflow)
                if mine is not None:
                    mine[id(tags)] = tags
        for agent in tags.fixed_agents:
            self.fixed_nodes_of(agent)[id(tags)] = tags

    def keyed_by_workflows(self, t: NodeTags) -> bool:
        """Whether the key of `t`'s node reads the workflows that touched it, so that their changes re-key it.
        A fixed prompt's key reads its agents' demand alone (score), unless some request read the node past
        its own fixed prompt; asked as each request tags the node, after tagging set both."""
        return t.past_fixed or not t.fixed_agents or not self._by_forecast

    def fixed_nodes_of(self, agent: str) -> dict[int, NodeTags]:
        nodes = self.fixed_nodes.get(agent)
        if nodes is None:
            nodes = self.fixed_nodes[agent] = {}
            if len(self.fixed_nodes) > MAX_TRACKED_AGENTS:
                self.invalidate(self.fixed_nodes.pop(next(iter(self.fixed_nodes))))
        return nodes

    def invalidate(
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
        cost = self._cost  # a miss's cost reads the node's host copy, unannounced: never rising
        rising = rising and not cost
        gone = None  # rarely any: no list made per call
        for key, t in nodes.items():
            if t.evicted:
                if gone is None:
                    gone = []
                gone.append(key)
                continue
            kept = t.kept
            if kept is not None and kept.epoch == FORGOTTEN:  # reported already since its key was last computed
                continue
            up = rising
            if fallen is not None and not cost:
                agents = t.workflows.get(fallen[0])
                up = agents is None or fallen[1].isdisjoint(agents)
            # A key grows with its forecast value; one valued by its read rate alone (value 0) reads a rate
            # that falls with time. One that can only have grown is not reported (RISEN): the heap re-keys it
            # when it reaches its top.
            if up and kept is not None and kept.key is not None and kept.key[1] > 0.0:
                kept.epoch = RISEN
            else:
                self.forget(t)
        if gone is not None:
            for key in gone:
                del nodes[key]

    # -- re-keys by age

    def rekey_at(self, t: NodeTags, when: float) -> None:
        """Schedule `t`'s key to be recomputed at `when` (on the policy clock): its age's value changes then."""
        kept = kept_of(t)
        if kept.rekey_at == when:
            return
        if when == math.inf:  # the oldest bucket: its value stays
            kept.rekey_at = 0.0
            return
        kept.rekey_at = when
        rekeys = self.rekeys
        if len(rekeys) >= MAX_REKEYS:  # drop the entries of nodes evicted or re-keyed since
            rekeys[:] = [e for e in rekeys if kept_of(e[2]).rekey_at == e[0] and not e[2].evicted]
            heapq.heapify(rekeys)
            if len(rekeys) >= MAX_REKEYS:  # that many live retired nodes: each is scheduled again when next keyed
                for _, _, scheduled in rekeys:
                    kept_of(scheduled).rekey_at = 0.0
                rekeys.clear()
        self._rekey_sequence += 1
        heapq.heappush(rekeys, (when, self._rekey_sequence, t))

    def rekey_aged(self, now: float) -> None:
        """Forget the keys of the retired nodes whose age crossed into another bucket by `now`."""
        rekeys = self.rekeys
        while rekeys and rekeys[0][0] <= now:
            when, _, t = heapq.heappop(rekeys)
            kept = kept_of(t)
            if kept.rekey_at == when:  # else re-keyed since (touched, or a new epoch)
                kept.rekey_at = 0.0
                if not t.evicted:
                    self.forget(t)
