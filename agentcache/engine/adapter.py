"""The SGLang side of the policy core: the pieces the plugin and the replay share.

- :class:`PolicyStrategy` is SGLang's eviction plug point (``EvictionStrategy``)
  answering with the policy's priority.
- :class:`TaggedFullComponent` is SGLang's FULL KV component that also keeps a
  node's tags whole when the tree splits it, counts evictions per node class,
  and, for a policy that keeps its keys, orders eviction with an
  :class:`EvictionHeap` kept across eviction rounds, which learns of new
  leaves from SGLang's leaf set made a :class:`RecordedLeaves`. Where its
  owner takes policy faults (the server), a policy that raises while
  eviction consults it is dropped for SGLang's LRU instead of taking the
  scheduler down.
- :func:`install_policy` wires both into a ``UnifiedRadixCache`` on the Python
  tree core; :func:`split_at`, :func:`ends_at` and :func:`path_nodes` are the
  tree walks the adapters need (fixed_prompt.py makes the fixed-prompt split of
  them); :func:`held_by_class` and :func:`queue_prefetch` are what the server's
  statistics and its prefetch step do, and the replay's too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from sglang.srt.mem_cache.base_prefix_cache import InsertParams
from sglang.srt.mem_cache.evict_policy import EvictionStrategy, LRUStrategy
from sglang.srt.mem_cache.unified_cache.components import ComponentType, EvictLayer, FullComponent

from agentcache.engine.heap import EvictionHeap
from agentcache.policy import CachePolicy, NodeClass, prefetch, tags_of
from agentcache.policy.nodes import TAGS_ATTR

FULL = ComponentType.FULL
PREFETCHED_ATTR = "agentcache_prefetched"  # on nodes a prefetch brought to the device, until a request reads them


class PolicyStrategy(EvictionStrategy):
    """Eviction order from an agentcache policy: smallest priority evicted first."""

    def __init__(self, policy: CachePolicy):
        self.policy = policy
        # SGLang calls this for every evictable leaf at every eviction: the policy's own method, no wrapper.
        self.get_priority = policy.priority  # type: ignore[method-assign]

    def get_priority(self, node: Any) -> tuple:
        return self.policy.priority(node)


class TaggedFullComponent(FullComponent):
    """FULL component that carries agentcache tags across node splits and counts evictions by class."""

    def __init__(self, cache: Any, params: Any):
        super().__init__(cache, params)
        self.policy: CachePolicy | None = None
        self.eviction_heap: EvictionHeap | None = None  # set where the policy keeps its keys
        self.evicted_tokens: Counter[str] = Counter()
        self.evicted_nodes: Counter[str] = Counter()
        self.on_evict: Callable[[str, int], None] | None = None  # (node class, tokens), e.g. for metrics
        # Set by an owner that takes the policy's faults (the server): called with where the policy raised and
        # the exception, after which eviction goes by SGLang's LRU. Unset (the replay), a fault is raised.
        self.on_policy_fault: Callable[[str, Exception], None] | None = None
        self._round_unordered = False  # the policy was dropped during an eviction round: SGLang's heap is not built
        self.prefetch_wasted_tokens = 0

    def drop_policy(self, where: str, exc: Exception) -> None:
        """The policy raised where eviction consults it (`where`): report it, and evict by SGLang's LRU from now
        on, the policy consulted no more; raise it where no owner takes faults, or where the policy was dropped
        already (SGLang's own fault, not the policy's)."""
        if self.on_policy_fault is None or self.policy is None:
            raise exc
        self.on_policy_fault(where, exc)
        self.policy = None
        self.eviction_heap = None
        self.tree_core.eviction_strategy = LRUStrategy()
        self.session_ref_eviction_strategy = None  # SGLang binds the strategy's get_priority again at its next use
        self._round_unordered = True

    def redistribute_on_node_split(self, new_parent: Any, child: Any) -> None:
        super().redistribute_on_node_split(new_parent, child)
        # Whoever read the whole node read its prefix: the new parent inherits the tags.
        tags = tags_of(child)
        if tags is not None:
            copied = tags.copy()
            copied.depth = tags.depth - len(child.key)
            copied.node_id = new_parent.id
            setattr(new_parent, TAGS_ATTR, copied)
            if self.policy is not None:
                try:
                    self.policy.forget_key(tags)  # the child's key reads its size
                    self.policy.adopt(copied)
                except Exception as exc:
                    self.drop_policy("a node split", exc)

    def evict_component(
        self, node: Any, device_frees: Any, host_frees: Any, cache_actions: Any, target: Any = EvictLayer.DEVICE
    ) -> tuple[int, int]:
        freed, host_freed = super().evict_component(node, device_frees, host_frees, cache_actions, target)
        if freed:
            tags = tags_of(node)
            node_class = NodeClass.UNTAGGED
            if tags is not None:
                tags.evicted = True  # the policy's own record: SGLang may delete the node object outright
            if self.policy is not None:
                try:
                    node_class = self.policy.classify(node)
                    if tags is not None:
                        self.policy.on_evicted(tags, freed, node_class)
                except Exception as exc:
                    self.drop_policy("an eviction's bookkeeping", exc)
            self.evicted_tokens[node_class] += freed
            self.evicted_nodes[node_class] += 1
            if getattr(node, PREFETCHED_ATTR, False):
                self.prefetch_wasted_tokens += freed  # loaded ahead, evicted before any request read it
                setattr(node, PREFETCHED_ATTR, False)
            if self.on_evict is not None:
                self.on_evict(node_class, freed)
        return freed, host_freed

    def _evict_device_start(self, request_cnt: int) -> None:
        self._round_unordered = False
        try:
            if self.eviction_heap is None:
                return super()._evict_device_start(request_cnt)
            self.eviction_heap.sync(self.tree_core)
        except Exception as exc:
            self.drop_policy("an eviction round's start", exc)
            self._round_unordered = False
            return super()._evict_device_start(request_cnt)
        self._evict_device_request_cnt = request_cnt
        self._evict_device_last_node = None

    def _evict_device_next_node(self, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any) -> Any:
        try:
            return self._next_victim(tracker, device_frees, host_frees, cache_actions)
        except Exception as exc:
            self.drop_policy("an eviction's choice", exc)
            return self._next_victim(tracker, device_frees, host_frees, cache_actions)

    def _next_victim(self, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any) -> Any:
        heap = self.eviction_heap
        if heap is None:
            if self._round_unordered:  # the policy was dropped in this round: SGLang's walk starts over
                self._round_unordered = False
                super()._evict_device_start(self._evict_device_request_cnt)
            return super()._evict_device_next_node(tracker, device_frees, host_frees, cache_actions)
        leaves = self.tree_core.evictable_device_leaves
        last = self._evict_device_last_node
        if last is not None and last.parent is not None and last.parent in leaves:
            heap.push(last.parent)  # the evicted leaf's parent may be a leaf now, as in SGLang's walk
        self._evict_device_last_node = None
        if tracker[self.component_type] < self._evict_device_request_cnt:
            node = heap.pop(leaves)
            if node is not None:
                self._evict_device_last_node = node
                return node.id
        return None

    def _evict_device_end(self) -> None:
        self._round_unordered = False
        if self.eviction_heap is None:
            return super()._evict_device_end()
        self._evict_device_last_node = None

    def drive_host_eviction(
        self, num_tokens: int, tracker: Any, device_frees: Any, host_frees: Any, cache_actions: Any
    ) -> None:
        try:
            super().drive_host_eviction(num_tokens, tracker, device_frees, host_frees, cache_actions)
        except Exception as exc:
            self.drop_policy("a host eviction", exc)
            super().drive_host_eviction(num_tokens, tracker, device_frees, host_frees, cache_actions)


def host_only_tokens(node: Any) -> int:
    """Tokens a load-back of `node` would bring to the device (0 unless host memory alone holds it)."""
    if node.parent is None or not node.evicted or not getattr(node, "backuped", False):
        return 0
    return sum(len(n.key) for n in host_only_path(node))


def cached_nodes(cache: Any) -> Iterator[Any]:
    """Every node the device holds."""
    stack = list(cache.tree_core.root_node.children.values())
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if not node.evicted:
            yield node


def held_by_class(cache: Any, policy: CachePolicy) -> dict[str, int]:
    """Device tokens held, per node class (retired, fixed, history, untagged)."""
    held: Counter[str] = Counter()
    for node in cached_nodes(cache):
        held[policy.classify(node)] += len(node.key)
    return dict(held)


def queue_prefetch(cache: Any, policy: Any, budget_tokens: int, complete: Callable[[], None] | None = None) -> int:
    """Start loading back, from host memory, the host-only cache the policy's forecasts want next, within the
    budget (PBKV's prefetch); tokens queued. The server leaves the loads to its next prefill batch; a
    caller with no such batch (the replay) passes `complete`, run after each load is queued."""
    loaded = 0
    for node in prefetch.plan(policy.prefetch_candidates(), budget_tokens, host_only_tokens):
        host_only = host_only_path(node)
        if cache.load_back(node.id):
            if complete is not None:
                complete()
            mark_prefetched(host_only)
            loaded += sum(len(n.key) for n in host_only)
    return loaded


def host_only_path(node: Any) -> list[Any]:
    """`node` and its ancestors that only host memory holds (what a load-back of `node` brings back)."""
    out = []
    while node.parent is not None and node.evicted:
        out.append(node)
        node = node.parent
    return out


def mark_prefetched(nodes: list[Any]) -> None:
    for node in nodes:
        setattr(node, PREFETCHED_ATTR, True)


def take_prefetched(path: list[Any]) -> int:
    """Tokens of `path` a prefetch brought in and no request has read yet; marks them read."""
    total = 0
    for node in path:
        if getattr(node, PREFETCHED_ATTR, False):
            total += len(node.key)
            setattr(node, PREFETCHED_ATTR, False)
    return total


def install_policy(cache: Any, policy: CachePolicy, *, order_eviction: bool = True) -> None:
    """Attach `policy` to a UnifiedRadixCache built with TaggedFullComponent.

    With `order_eviction` False the policy only keeps tags and statistics while
    the cache keeps its own (built-in) eviction strategy.
    """
    component = cache.components[FULL]
    if not isinstance(component, TaggedFullComponent):
        raise TypeError("the cache must be built with component_registry_override={FULL: TaggedFullComponent}")
    component.policy = policy
    # An untagged node reads None from its class: in the compiled policy core a missing attribute raises and
    # catches an AttributeError at every read (about half a microsecond; several per request).
    setattr(type(cache.tree_core.root_node), TAGS_ATTR, None)
    if order_eviction:
        cache.tree_core.eviction_strategy = PolicyStrategy(policy)
        # The FULL component caches the strategy's bound get_priority on first use.
        component.session_ref_eviction_strategy = None
        # Session radix caches rank by session references first: SGLang's own walk keeps that order.
        if policy.keeps_keys and not cache.tree_core.enable_session_radix_cache:
            component.eviction_heap = EvictionHeap(policy)


def path_nodes(cache: Any, node_id: Any) -> list[Any]:
    """The nodes from the root's child down to `node_id`."""
    core = cache.tree_core
    node = core.node_by_id(node_id)
    path = []
    while node is not None and node is not core.root_node:
        path.append(node)
        node = node.parent
    path.reverse()
    return path


def ends_at(path: list[Any], depth: int) -> bool:
    """Whether a node of `path` (from the root's child down), or the root at depth 0, ends exactly `depth`
    tokens in: a split there would find the boundary made already, its insert walk only touching nodes."""
    if depth <= 0:
        return True
    end = 0
    for node in path:
        end += len(node.key)
        if end >= depth:
            return end == depth
    return False


def split_at(cache: Any, key: Any, values: Any, cut: int, priority: int = 0) -> None:
    """Make a node boundary fall exactly `cut` tokens into an already inserted `key`.

    Re-inserting a prefix that the tree already holds splits the node it ends
    in and frees nothing (prev_prefix_len covers it); SGLang uses the same
    insert to split a request's prompt from its output.
    """
    if 0 < cut < len(key):
        cache.insert(
            InsertParams(key=key[:cut], value=values[:cut], prev_prefix_len=cut, inserted_len=cut, priority=priority)
        )
