"""One SGLang radix cache of a fixed capacity, fed requests the way SGLang's scheduler feeds it.

Per request, as the server does (see SGLang 0.5.23 ``scheduler`` / ``UnifiedRadixCache``):

1. match the prompt, at most prompt-1 tokens (the last one is always computed);
   with a host tier, load the part that only host memory still holds back to
   the device (``load_back``), as the scheduler's admission does;
2. lock the matched node, allocate slots for prompt + output - 1 tokens, evicting
   whole leaves through the cache (``evict_for_alloc``) when short;
3. insert prompt + output - 1 into the tree, then re-insert the prompt and the
   fixed prompt so node boundaries fall at both;
4. unlock; tag the path for the policy; with a host tier, run the scheduler
   step's HiCache bookkeeping (write-through acks, load acks).

With `sessions` (SGLang's ``--enable-session-radix-cache``, the session-lru/session-lfu
baselines) a request's session is its workflow: its generation is taken when the
request is admitted and its path registered when it finishes, as the scheduler
does (``ensure_session_generation``, ``register_session_ref``); the workflow's end
closes the session (``release_radix_session``, what ``POST /close_session`` runs).

The cache is SGLang's real ``UnifiedRadixCache`` on its Python tree core, over
CPU KV pools of exactly `capacity` token slots; the host tier is SGLang's real
HiCache (write-through, host pool of `host_capacity` slots, its own eviction):
agentcache/replay/cpu_cache.py builds both.
:class:`SGLangAloneCache` is the same cache as plain SGLang runs it, with no
agentcache (its default tree core): the baseline the hot-path benchmark times.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, NamedTuple

import torch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache.engine.adapter import (
    FULL,
    PREFETCHED_ATTR,
    TaggedFullComponent,
    held_by_class,
    install_policy,
    path_nodes,
    queue_prefetch,
    split_at,
    take_prefetched,
)
from agentcache.engine.fixed_prompt import split_and_tag
from agentcache.policy import CachePolicy, NodeClass
from agentcache.replay.cpu_cache import build_cache
from agentcache.replay.tokens import EncodedRequest
from agentcache.tags import Tags, WorkflowKey

WARMUP_WORKFLOW = "\x00warm-up"  # the pseudo workflow of warm-up requests (never active, never ended)


class Admission(NamedTuple):
    """A request admitted and not finished yet: its slots are allocated and its matched prefix is held."""

    enc: EncodedRequest
    tags: Tags
    tokens: array
    values: Any  # slot indices of prompt and output (the matched prefix's, then fresh ones)
    lock: Any
    hit_tokens: int
    loaded_tokens: int
    prefetched_tokens: int
    owned: int  # leading tokens whose slots the tree owns (the matched prefix; the prompt once checkpointed)
    # Leading tokens this request inserted already (SGLang's cache_inserted_len): an insert counts a hit on
    # the nodes past it only, so lfu and slru count each request once per node.
    inserted: int = 0
    session_generation: int | None = None  # with sessions: the workflow's session incarnation at admission


class ServeResult(NamedTuple):
    hit_tokens: int  # prompt tokens served from the device cache as it was when the request came
    loaded_tokens: int  # prompt tokens loaded back from the host tier for this request
    prefetched_tokens: int  # of the hit tokens, those a prefetch had brought to the device
    admitted: bool  # False when even an empty cache could not hold the request


@dataclass
class CacheStats:
    evict_calls: int = 0
    evicted_tokens: int = 0
    oversized: int = 0

    def count_eviction(self, evicted_tokens: int | None) -> None:
        """An allocation or a retraction that evicted `evicted_tokens` (None: it evicted nothing, not counted)."""
        if evicted_tokens is not None:
            self.evict_calls += 1
            self.evicted_tokens += evicted_tokens


class Slots(NamedTuple):
    values: Any  # slot indices of the whole request: its cached prefix's, then fresh ones
    evicted_tokens: int | None  # what the eviction freed; None when the free slots sufficed


def allocate(cache: UnifiedRadixCache, anchor: Any, cached: int, need: int) -> Slots | None:
    """Slots for a request whose first `cached` tokens end at `anchor` (held) and `need` tokens more, evicting as
    SGLang's allocation does; None, with nothing evicted, when free and evictable slots together are too few."""
    fresh = allocate_fresh(cache, need)
    if fresh is None:
        return None
    prefix = cache.path_device_indices(anchor)[:cached]
    return Slots(torch.cat([prefix.to(torch.int64), fresh.values.to(torch.int64)]), fresh.evicted_tokens)


def allocate_fresh(cache: UnifiedRadixCache, need: int) -> Slots | None:
    """`need` free slots, evicting as SGLang's allocation does; None, with nothing evicted, when free and evictable
    slots together are too few."""
    allocator = cache.token_to_kv_pool_allocator
    if need > allocator.available_size() + cache.evictable_size():
        return None
    evicted = None
    shortfall = need - allocator.available_size()
    if shortfall > 0:
        evicted = cache.evict_for_alloc(EvictParams(num_tokens=shortfall)).num_tokens_evicted
    fresh = allocator.alloc(need)
    if fresh is None:
        raise RuntimeError(f"allocation of {need} slots failed after eviction; the cache's accounting is broken")
    return Slots(fresh, evicted)


class SGLangAloneCache:
    """SGLang's radix cache as a user runs it with no agentcache (`--radix-eviction-policy BUILTIN`): SGLang's own
    components on its default tree core (the Rust one where the install supports it), fed the same SGLang calls
    per request as :meth:`ReplayCache.serve`. The baseline for what the plugin costs on the scheduler's thread."""

    def __init__(self, capacity: int, builtin: str):
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 tokens, got {capacity}")
        self.cache = build_cache(capacity, builtin, alone=True)

    @property
    def tree_core(self) -> str:
        return type(self.cache.tree_core).__name__

    def serve(self, enc: EncodedRequest) -> int | None:
        """Serve one request as ReplayCache.serve does, without agentcache: match, hold, allocate (evicting), then
        what SGLang's ``checkpoint_into_tree`` does once it finishes (insert prompt and output, re-insert the
        prompt so a node boundary falls at its end), release. The prompt tokens found cached; None when it
        cannot fit."""
        cache = self.cache
        tokens = enc.tokens
        prompt_len = enc.prompt_len
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:prompt_len], limit=prompt_len - 1)))
        hit, anchor = match.device_prefix_len, match.last_device_node
        lock = cache.lock(anchor)
        slots = allocate(cache, anchor, hit, len(tokens) - 1 - hit)
        if slots is not None:
            key = RadixKey(tokens[: len(tokens) - 1])
            cache.insert(InsertParams(key=key, value=slots.values, prev_prefix_len=hit, inserted_len=0))
            split_at(cache, key, slots.values, prompt_len, priority=1)
        cache.unlock(lock)
        return hit if slots is not None else None


class ReplayCache:
    """A capacity-bounded SGLang cache (with an optional host tier) plus the policy that orders its evictions."""

    def __init__(
        self,
        capacity: int,
        policy: CachePolicy,
        builtin: str | None = None,
        host_capacity: int = 0,
        *,
        sessions: bool = False,
    ):
        if capacity < 2:
            raise ValueError(f"capacity must be >= 2 tokens, got {capacity}")
        if host_capacity < 0:
            raise ValueError(f"host capacity must be >= 0 tokens, got {host_capacity}")
        self.capacity = capacity
        self.policy = policy
        self.cache = build_cache(capacity, builtin, host_capacity, sessions=sessions)
        self.sessions = sessions
        self.host_tier = host_capacity > 0
        # With a built-in strategy the policy only keeps tags (for per-class statistics).
        install_policy(self.cache, policy, order_eviction=builtin is None)
        self.allocator = self.cache.token_to_kv_pool_allocator
        self.component: TaggedFullComponent = self.cache.components[FULL]
        self.stats = CacheStats()
        self._fixed_tokens: dict[str, array] = {}  # agent -> its fixed prompt's tokens, for warm-up requests
        self._warmups = 0

    def _match(self, tokens: array, prompt_len: int) -> tuple[int, int, Any]:
        """(device hit, tokens loaded back from host, node the request's prefix ends at)."""
        cache = self.cache
        match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens[:prompt_len], limit=prompt_len - 1)))
        if not (self.host_tier and match.host_hit_length > 0 and cache.load_back(match.best_match_node)):
            return match.device_prefix_len, 0, match.last_device_node
        loaded = len(cache.tree_core.collect_full_device_indices(match.best_match_node, match.last_device_node))
        cache.ready_to_load_host_cache()
        return match.device_prefix_len, loaded, match.best_match_node

    def admit(self, enc: EncodedRequest, tags: Tags, *, output: bool = True) -> Admission | None:
        """What SGLang's scheduler does when it admits a request to a prefill batch: match its prompt, hold
        the matched prefix, and allocate slots for the rest of the prompt and, with `output`, for the whole
        output at once (the untimed replay, which finishes the request at once; the timed one allocates output
        a decode step at a time, `decode_slots`), evicting what it must.

        None when the free and evictable slots cannot hold it (the untimed replay: not even an empty cache
        could; counted).
        """
        cache = self.cache
        tokens = enc.tokens
        kv_len = len(tokens) - 1  # the last generated token is never fed back, so it has no KV
        hit, loaded, anchor = self._match(tokens, enc.prompt_len)
        cached = hit + loaded
        lock = cache.lock(anchor)
        self.policy.on_admit(tags)
        prefetched = take_prefetched(path_nodes(cache, anchor)) if self.host_tier else 0  # only a host tier prefetches
        slots = allocate(cache, anchor, cached, (kv_len if output else enc.prompt_len) - cached)
        if slots is None:
            cache.unlock(lock)
            if self.host_tier:
                cache.check_hicache_events()  # a load back started by the match completes all the same
            self.stats.oversized += 1
            return None
        self.stats.count_eviction(slots.evicted_tokens)
        # The scheduler takes the session's generation when the request arrives (warm-ups belong to no session).
        generation = (
            cache.ensure_session_generation(tags.workflow)
            if self.sessions and tags.workflow != WARMUP_WORKFLOW
            else None
        )
        return Admission(enc, tags, tokens, slots.values, lock, hit, loaded, prefetched, cached, 0, generation)

    def admissible(self, enc: EncodedRequest, output_tokens: int, reserved: float) -> int | None:
        """The prompt tokens `enc` would compute if admitted now; None if the free and evictable slots, less
        `reserved` (what the running requests are expected to write still), cannot hold the rest of its prompt
        and its `output_tokens`. Counted as SGLang counts them (schedule_policy's add_one_req): with the
        request's cached prefix pinned, which it holds and so cannot evict to make room for the rest."""
        # SGLang matches a waiting request at every scheduling round; the match splits the node it ends in, so
        # only the matched tokens are pinned.
        match = self.cache.match_prefix(
            MatchPrefixParams(key=RadixKey(enc.tokens[: enc.prompt_len], limit=enc.prompt_len - 1))
        )
        pin = self.cache.lock(match.last_device_node)
        try:
            room = self.room()
        finally:
            self.cache.unlock(pin)
        computed = enc.prompt_len - match.device_prefix_len
        return computed if computed + output_tokens <= room - reserved else None

    def room(self) -> int:
        """Free and evictable slots."""
        return self.allocator.available_size() + self.cache.evictable_size()

    def decode_slots(self, count: int) -> list[int] | None:
        """One slot for each of `count` running requests' next decode step, evicting by the policy as SGLang's
        alloc_for_decode does; None, with nothing evicted, when free and evictable slots are too few."""
        slots = allocate_fresh(self.cache, count)
        if slots is None:
            return None
        self.stats.count_eviction(slots.evicted_tokens)
        return slots.values.tolist()

    def retract(self, admission: Admission, output_slots: Sequence[int], keep_free: int) -> None:
        """What SGLang does to a running request when decode runs out of slots (``release_req``): its output
        so far is freed without entering the tree, its hold on the prompt (in the tree since its prefill) is
        released, and the tree is evicted until `keep_free` slots are free for the requests that go on."""
        if output_slots:
            self.allocator.free(torch.tensor(output_slots, dtype=torch.int64))
        self.cache.unlock(admission.lock)
        shortfall = min(keep_free - self.allocator.available_size(), self.cache.evictable_size())
        if shortfall > 0:
            self.stats.count_eviction(self.cache.evict_for_alloc(EvictParams(num_tokens=shortfall)).num_tokens_evicted)

    def checkpoint(self, admission: Admission, now: float) -> Admission:
        """What SGLang does once a request's prompt is computed (``cache_unfinished_req``): the prompt enters
        the tree, where later requests can share it while this one decodes, and the hold moves to its end."""
        cache, enc = self.cache, admission.enc
        key = RadixKey(admission.tokens[: enc.prompt_len])
        prompt_values = admission.values[: enc.prompt_len]
        inserted = cache.insert(
            InsertParams(key=key, value=prompt_values, prev_prefix_len=admission.owned, inserted_len=admission.inserted)
        )
        end = inserted.last_device_node
        tags = admission.tags
        split_and_tag(cache, end, key, prompt_values, tags.fixed, self.policy.tag_path, tags, now)
        lock = cache.lock(end)
        cache.unlock(admission.lock)
        # Where another request inserted the same tokens first, the tree kept its slots (and freed ours).
        values = torch.cat([cache.path_device_indices(end).to(torch.int64), admission.values[enc.prompt_len :]])
        return admission._replace(values=values, lock=lock, owned=enc.prompt_len, inserted=enc.prompt_len)

    def finish(self, admission: Admission, now: float, output_slots: Sequence[int] = ()) -> None:
        """What SGLang does when the request finishes: insert prompt and output into the tree, node boundaries
        at the prompt's end and at the fixed prompt's, release the held prefix, and tag the path. `output_slots`:
        the output's slots where they were allocated a decode step at a time, after the admission's."""
        cache, enc = self.cache, admission.enc
        key = RadixKey(admission.tokens[: len(admission.tokens) - 1])
        cached = admission.hit_tokens + admission.loaded_tokens
        values = admission.values
        if output_slots:
            values = torch.cat([values, torch.tensor(output_slots, dtype=torch.int64)])
        try:
            inserted = cache.insert(
                InsertParams(key=key, value=values, prev_prefix_len=admission.owned, inserted_len=admission.inserted)
            )
            tags = admission.tags
            end = inserted.last_device_node
            split_and_tag(
                cache, end, key, values, tags.fixed, self.policy.tag_path, tags, now, cached, enc.prompt_len,
                prompt_end=enc.prompt_len,
            )  # fmt: skip
            if admission.session_generation is not None:
                self._register_session(tags.workflow, admission.session_generation, end)
        finally:
            cache.unlock(admission.lock)
            if self.host_tier:
                cache.check_hicache_events()  # the scheduler step: write-through and load acks

    def _register_session(self, workflow: str, generation: int, end: Any) -> None:
        """What ``cache_finished_req`` does last with sessions on: the session now holds the path to `end`."""
        request = SimpleNamespace(session_id=workflow, session=None, session_generation=generation)
        self.cache.session_refs.register_session_ref(request, leaf=end)

    def end_workflow(self, workflow: str, now: float) -> None:
        """The workflow ended: the policy hears it and, with sessions, its session closes (``/close_session``)."""
        self.policy.on_end(WorkflowKey("", workflow), now)
        if self.sessions:
            self.cache.release_radix_session(workflow)

    def serve(self, enc: EncodedRequest, tags: Tags, now: float) -> ServeResult:
        """Admit and finish at once: the request served as it arrives, alone (or refused), and released."""
        admission = self.admit(enc, tags)
        if admission is None:
            self.policy.on_release(tags, now)
            return ServeResult(0, 0, 0, admitted=False)
        self.finish(admission, now)
        self.policy.on_release(tags, now)
        return ServeResult(admission.hit_tokens, admission.loaded_tokens, admission.prefetched_tokens, admitted=True)

    def prefetch(self, budget_tokens: int) -> int:
        """Load back from host memory what the policy's forecasts want next, within the budget; tokens loaded.

        The server's prefetch step queues the same loads; here they complete at once (the replay has no time).
        """

        def complete() -> None:
            self.cache.ready_to_load_host_cache()
            self.cache.check_hicache_events()

        return queue_prefetch(self.cache, self.policy, budget_tokens, complete)

    def warm(self, agent: str, now: float, max_tokens: int) -> int:
        """Recompute `agent`'s fixed prompt into the cache with a 1-token request (no host tier needed).

        CacheScout's warm-up request: the tokens are those of the agent's last
        fixed prompt seen here. Returns the tokens computed: 0 if the prompt is
        already cached or computing it would take more than `max_tokens`.
        """
        tokens = self._fixed_tokens.get(agent)
        if tokens is None:
            return 0
        match = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens, limit=len(tokens) - 1)))
        before = match.device_prefix_len
        if before >= len(tokens) - 1 or len(tokens) - before > max_tokens:
            return 0
        self._warmups += 1
        probe = EncodedRequest(list(tokens) + [-self._warmups], len(tokens), len(tokens), ())
        result = self.serve(probe, Tags(workflow=WARMUP_WORKFLOW, agent=agent, fixed_tokens=len(tokens)), now)
        if not result.admitted:
            return 0
        depth = 0
        end = self.cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).last_device_node
        for node in path_nodes(self.cache, end):
            depth += len(node.key)
            if depth > before:
                setattr(node, PREFETCHED_ATTR, True)
        return len(tokens) - before

    def remember_fixed_prompt(self, agent: str, enc: EncodedRequest) -> None:
        if enc.fixed_len > 1:
            self._fixed_tokens[agent] = enc.tokens[: enc.fixed_len]

    def retired_tokens(self) -> int:
        """Device tokens held only by ended workflows (what a conservative prefetch may displace)."""
        return held_by_class(self.cache, self.policy).get(NodeClass.RETIRED, 0)

    def held_tokens(self) -> int:
        return self.capacity - self.allocator.available_size()
