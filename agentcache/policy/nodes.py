"""What a policy keeps on each radix-tree node, and how it reads the engine's nodes.

The policy core never imports an engine. It reads engine nodes through the small :class:`CacheNode` protocol
(SGLang's radix-tree nodes satisfy it as they are) and keeps its own bookkeeping in a :class:`NodeTags` record that
the engine adapter attaches to each node (``TAGS_ATTR``); :class:`Latest` is a (workflow, agent)'s latest path as
the policy (agentcache.policy.base) tagged it.
"""

from __future__ import annotations

from collections.abc import Sized
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

from agentcache.policy.kept_key import KeptKey
from agentcache.tags import WorkflowKey

TAGS_ATTR = "agentcache_tags"

# A node remembers at most this many workflows (ended ones go first, then the least recent), so a
# shared prefix touched by thousands of workflows stays small; its agents' demand values it anyway.
MAX_WORKFLOWS_PER_NODE = 64
# Agent names are the client's: a node remembers at most this many agents per workflow (and the policy this
# many latest paths per workflow), and at most MAX_FIXED_AGENTS_PER_NODE agents whose fixed prompt covers it.
# Past either, the least recently tagged go first, down to three quarters (once per quarter of new agents), so
# a client naming a new agent at every request leaves each node's state, and the time to score it, bounded.
MAX_AGENTS_PER_WORKFLOW = 16
MAX_FIXED_AGENTS_PER_NODE = 64
# Agents whose fixed-prompt node is remembered for prefetching; the least recently seen go first.
MAX_TRACKED_AGENTS = 4096


@dataclass(slots=True, eq=False)
class NodeTags:
    """Policy bookkeeping for one radix-tree node."""

    # A_w(c): workflow key -> its agents that touched c, each with the number of that (workflow, agent)'s
    # request that last did (which tells whether c is on the pair's latest path, see CachePolicy.latest)
    workflows: dict[WorkflowKey, dict[str, int]] = field(default_factory=dict)
    fixed_agents: set[str] = field(default_factory=set)  # agents whose fixed prompt covers c
    # Some request touched c past its fixed prompt (else every agent in `workflows` is in `fixed_agents`).
    past_fixed: bool = False
    last_access: float = 0.0  # policy clock (seconds) at the last touch
    hits: int = 0  # requests that reused c from cache
    # Requests whose cached prefix ended at c (they read c and then computed what follows): where several did,
    # c is a prefix that many continuations share (not copied to the new parent of a split: none ended there).
    stops: int = 0
    depth: int = 0  # tokens from the root to the end of c
    created: float = 0.0  # policy clock at the first touch
    in_prompt: bool = False  # some request's prompt covered c (else c is generated output no prompt re-sent yet)
    evicted: bool = False  # the engine evicted c from the device (what was read of it is no longer knowable)
    node_id: Any = None  # the engine node's id: what the engine's eviction heap re-keys when c's key changes
    # A policy that keeps keys (CachePolicy.keeps_keys): c's kept eviction key, which only its key module
    # (agentcache.policy.pbkv.keys) reads or writes; on the node so that a key asked for costs no lookup.
    kept: KeptKey | None = None

    def copy(self) -> NodeTags:
        return NodeTags(
            workflows={w: dict(a) for w, a in self.workflows.items()},
            fixed_agents=set(self.fixed_agents),
            past_fixed=self.past_fixed,
            last_access=self.last_access,
            hits=self.hits,
            depth=self.depth,
            created=self.created,
            in_prompt=self.in_prompt,
            evicted=self.evicted,
        )


class CacheNode(Protocol):
    """The engine-side view of a radix node that policies read."""

    last_access_time: float  # engine recency stamp, larger is more recent
    hit_count: int
    key: Sized | None  # this node's own tokens
    parent: Any  # the node above (None at the root)


class Latest(NamedTuple):
    """A (workflow, agent)'s latest request, as its path was tagged."""

    stamp: int
    end: Any  # the deepest node of its path
    fixed: int = 0  # its fixed prompt's tokens
    matched: int | None = None  # tokens it found cached (None until it finished)
    prompt: int | None = None  # its prompt's tokens (None until it finished)
    depth: int = 0  # tokens of its path
    # Told by an oracle (the replay, reading the trace; -1: not told): how many tokens of this path the pair's
    # next request reads again.
    reread: int = -1

    def region(self, depth: int) -> int:
        """Which part of this request a node ending `depth` tokens in belongs to: FIXED, CONTEXT (what it
        read from cache after its fixed prompt), FRESH (prompt tokens it computed) or OUTPUT."""
        if depth <= self.fixed:
            return FIXED
        if self.matched is None or depth <= self.matched:
            return CONTEXT
        if self.prompt is None or depth <= self.prompt:
            return FRESH
        return OUTPUT


FIXED, CONTEXT, FRESH, OUTPUT = 0, 1, 2, 3
NO_LATEST: dict[str, Latest] = {}  # shared, never written: the latest paths of a workflow with none


def tags_of(node: Any) -> NodeTags | None:
    return getattr(node, TAGS_ATTR, None)


def ensure_tags(node: Any, now: float = 0.0) -> NodeTags:
    tags = getattr(node, TAGS_ATTR, None)
    if tags is None:
        tags = NodeTags(created=now, node_id=getattr(node, "id", None))
        setattr(node, TAGS_ATTR, tags)
    return tags


def node_tokens(node: CacheNode) -> int:
    return len(node.key) if node.key is not None else 0


class NodeClass:
    """Coarse node classes, for statistics and for the lifecycle tier."""

    RETIRED: Final = "retired"  # touched by workflows, none of them still active
    FIXED: Final = "fixed"  # part of an agent's fixed prompt, used by an active workflow
    HISTORY: Final = "history"  # an active workflow's dynamic suffix
    UNTAGGED: Final = "untagged"  # no tagged request ever touched it

    ALL: Final = (RETIRED, FIXED, HISTORY, UNTAGGED)
