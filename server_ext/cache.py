"""The radix cache backend `agentcache`: SGLang's UnifiedRadixCache with its eviction ordered by a policy.

Runs in each scheduler process. It keeps SGLang's cache (and HiCache) whole,
on the Python tree core, and adds:

- per request: the tags the HTTP process stamped (agentcache.tags.Stamped),
  registered once when the scheduler creates the request (``observe``), their
  boundary made a page-aligned token offset;
- per insert: a node boundary at that offset, and the path tagged with the
  request's workflow and agent (``checkpoint_into_tree``, through the routine
  the replay uses too: agentcache.engine.fixed_prompt);
- control operations (end a workflow, a client's events: tool calls, plans and decisions; statistics)
  applied in the scheduler thread, in the order SGLang delivers them to every
  rank; what the read-only ones answer is in server_ext/views.py.

A policy that raises never takes the scheduler down. Inside eviction it is
dropped: the fault is logged with its traceback and counted (``policy_faults``
in the statistics), and the worker evicts by SGLang's LRU from then on. In its
bookkeeping (a request, a path's tags, an end, a client's event) the fault is counted, the first
at each place logged, and the request served: one odd request must not cost
every tenant the policy. Ranks run the same code on the same inputs, so they
fault at the same point and keep deciding alike.

The policy clock is the time the HTTP process stamped on each tagged request,
end and client event (server_ext/control.py: server_clock), so every
tensor-parallel rank sees the same clock and makes the same decisions.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any

from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache import compiled
from agentcache.cost import DEFAULT_COST
from agentcache.engine.adapter import (
    FULL,
    TaggedFullComponent,
    held_by_class,
    install_policy,
    queue_prefetch,
    take_prefetched,
)
from agentcache.engine.fixed_prompt import fixed_offset, split_and_tag
from agentcache.policy import CachePolicy, NodeClass, WorkflowRegistry, make_policy, prefetch
from agentcache.policy.pbkv import PBKVPolicy
from agentcache.predictor.tenants import per_tenant
from agentcache.server_ext.calls import Calls
from agentcache.server_ext.client_events import scoped_plan
from agentcache.server_ext.config import PluginConfig
from agentcache.server_ext.control_limits import FIRST_PAGE, Page
from agentcache.server_ext.metrics import Metrics
from agentcache.server_ext.records import TenantCounters, WorkflowRecords
from agentcache.server_ext.views import WorkflowNodes, stats
from agentcache.tags import Stamped, Tags, WorkflowKey, find, principal_of, scoped_agent
from agentcache.trace import Plan, plan_fields

logger = logging.getLogger("agentcache")

# Requests registered and not yet released. The scheduler aborts some requests (bad parameters) right
# after creating them, without a release: beyond this, the oldest is released.
MAX_PENDING_REQUESTS = 1 << 16
PREDICTOR_BUDGET_MS = 10.0  # a forecast slower than this is replaced by the fallback's
# One decode step of the cost model's reference model (6 ms): the idle host-to-device time a prefetch may use.
PREFETCH_STEP_S = 6e-3
# A tool event's type -> where a fault in it is counted, and the policy's hook that hears it.
_TOOL_HOOKS = {"tool_start": ("a tool start", "on_tool_start"), "tool_end": ("a tool end", "on_tool_end")}


class AgentCache(UnifiedRadixCache):
    config: PluginConfig = PluginConfig()  # set by the factory before construction
    tp_rank: int = 0

    def __init__(self, params: Any):
        super().__init__(params)
        cfg = self.config
        self.component: TaggedFullComponent = self.components[FULL]
        self.component.on_policy_fault = self._policy_dropped
        self.policy_faults: Counter[str] = Counter()  # where the policy raised (one inside eviction drops it)
        self.now = 0.0
        self._requests: OrderedDict[str, Tags] = OrderedDict()  # rid -> the tags the policy got
        self.calls = Calls()  # the requests of each n group (one logical call) not yet released
        self.counters: Counter[str] = Counter()
        self.invalid_tags: Counter[str] = Counter()
        self.metrics = Metrics.create(self.tp_rank)
        if self.metrics is not None:
            self.component.on_evict = self.metrics.evicted
        self.tenants = TenantCounters()
        self._start_policy()
        logger.info(
            "agentcache: policy %s (its core %s), lease %.0f s, tree core %s",
            cfg.policy,
            compiled.active(),
            cfg.lease_s,
            type(self.tree_core).__name__,
        )

    def _start_policy(self) -> None:
        """A new policy, knowing no workflow and no node: at the start, and after each flush of the cache."""
        cfg = self.config
        registry = WorkflowRegistry(lease_s=cfg.lease_s, max_active_per_tenant=cfg.max_workflows_per_tenant)
        graph_source = f"the call graph {cfg.call_graph_path}"
        predictor = (
            cfg.predictor.build(cfg.call_graph, call_graph_source=graph_source) if cfg.predictor is not None else None
        )
        self.policy: CachePolicy = make_policy(
            cfg.policy,
            registry=registry,
            call_graph=cfg.call_graph,
            predictor=predictor,
            call_graph_source=graph_source,
        )
        if isinstance(self.policy, PBKVPolicy):  # each tenant's agents forecast by a forecaster of its own
            self.policy.predictor.inner = per_tenant(self.policy.predictor.inner)
        if isinstance(self.policy, PBKVPolicy) and self.tp_world_size == 1:
            # One rank: a slow forecast may fall back on the clock. Several: only on faults every rank sees.
            self.policy.predictor.budget_ms = PREDICTOR_BUDGET_MS
        install_policy(self, self.policy)
        if self.metrics is not None:
            for coverage in self.policy.coverages():
                coverage.on_count = self.metrics.forecast
        self._prefetch_version = -1
        self.workflows = WorkflowRecords()
        self.views = WorkflowNodes()  # what the control routes read instead of the tree (server_ext/views.py)

    def reset(self) -> None:
        """SGLang's /flush_cache (run only while no request is in flight): the tree emptied, and the policy started
        over as on a fresh server. Its state named the nodes just dropped, and what it had learned (forecasts,
        timings, reuse) would carry into whatever runs next: a benchmark's next repetition, say."""
        super().reset()
        if hasattr(self, "component"):  # SGLang's own constructor may reset before ours has run
            self._start_policy()

    # -- requests

    def observe(self, req: Any) -> None:
        """Register a new request's tags (called once per request, on every rank)."""
        stamped = Stamped.from_wire(find(getattr(req.sampling_params, "custom_params", None)))
        # An n group's later requests (its samples) are the call its first one was: tagged alike, observed once.
        first = self.calls.join(req.rid, stamped)
        tenant = stamped.tenant
        if first:
            self._count("requests", tenant=tenant)
        if stamped.tags is None:
            if not first:
                return
            if stamped.reason is None:
                self._count("untagged_requests", tenant=tenant)
            else:
                self._invalid(stamped.reason, tenant)
            return
        self.now = max(self.now, stamped.tags.ts if stamped.tags.ts is not None else time.time())
        # The policy clock is the HTTP process's, identical on every rank; the boundary where the tree splits.
        fixed = fixed_offset(stamped.tags.fixed, len(req.origin_input_ids), self.page_size)
        tags = stamped.tags.replace(ts=self.now, fixed_tokens=fixed)
        self._requests[req.rid] = tags
        if len(self._requests) > MAX_PENDING_REQUESTS:  # the oldest's own release would find nothing: now
            self._release(next(iter(self._requests)))
        if not first:
            return
        self._consult("a request", self.policy.on_request, tags, self.now)
        if tags.implicit:  # no tags from the client: its own workflow, ended with it
            self._count("untagged_requests", tenant=tenant)
            return
        self._count("tagged_requests", tenant=tenant)
        self.workflows.on_request(tags.key, tags.agent_name, tags.agent)

    def admitted(self, req: Any) -> None:
        """SGLang admitted the request to a prefill batch and holds its matched prefix."""
        tags = self._requests.get(req.rid)
        if tags is not None:
            self._consult("an admission", self.policy.on_admit, tags)

    def checkpoint_into_tree(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        super().checkpoint_into_tree(req, up_to=up_to, **kwargs)
        tags = self._requests.get(req.rid)
        if tags is None or self.disable or req.last_node is None:
            return
        key = RadixKey(
            req.full_untruncated_fill_ids, req.extra_key, is_bigram=self.tree_core.is_eagle, cache_salt=req.cache_salt
        )
        # Unfinished, the prompt is computed and shareable, and the request runs on; finished, SGLang split its
        # prompt from its output already.
        finished = req.finished()
        matched = getattr(req, "cached_tokens", 0) if finished else None
        prompt = len(req.origin_input_ids) if finished else None
        used = self._consult("a checkpoint into the tree", self._split_and_tag, req, key, tags, matched, prompt)
        if matched is None or prompt is None:  # unfinished
            return
        if used:
            self._count("prefetch_used_tokens", used, metric="tokens")
        tenant = tags.tenant
        self._count("prompt_tokens", prompt, metric="tokens", tenant=tenant)
        self._count("hit_tokens", matched, metric="tokens", tenant=tenant)
        self._count("host_hit_tokens", getattr(req, "cached_tokens_host", 0), metric="tokens", tenant=tenant)

    def _split_and_tag(self, req: Any, key: RadixKey, tags: Tags, matched: int | None, prompt: int | None) -> int:
        """The request's path split at its fixed prompt and tagged; tokens of it a prefetch brought and it read.
        A split reads the tree's own slots."""
        path = split_and_tag(
            self, req.last_node, key, None, tags.fixed, self._tag_path, tags, tags.ts, matched, prompt,
            priority=req.priority or 0,
        )  # fmt: skip
        if not tags.implicit:
            self.views.tagged(tags.key, path)
        return 0 if matched is None else take_prefetched(path[: _nodes_within(path, matched)])

    def _tag_path(self, *args: Any) -> None:
        self._consult("tagging a path", self.policy.tag_path, *args)

    def prefetch_step(self) -> int:
        """Queue load-backs of the host-only cache the forecasts want next, within idle space and bandwidth.

        Called on decode-only scheduler steps, once per change of the
        workflows' state. SGLang's next prefill batch starts every queued
        load and waits for it layer by layer, so no request reads KV that is
        still loading (the safe way to load outside admission, per SGLang
        0.5.23's HiCache design).
        """
        policy = self.policy
        if self.cache_controller is None or self.config.prefetch == "off" or not isinstance(policy, PBKVPolicy):
            return 0
        if policy.registry.version == self._prefetch_version:
            return 0
        self._prefetch_version = policy.registry.version
        loaded = self._consult("a prefetch", self._queue_prefetch, policy) or 0
        if loaded:
            self._count("prefetched_tokens", loaded, metric="tokens")
        return loaded

    def _queue_prefetch(self, policy: PBKVPolicy) -> int:
        budget = prefetch.budget(
            prefetch.CONSERVATIVE,
            self.token_to_kv_pool_allocator.available_size(),
            held_by_class(self, policy).get(NodeClass.RETIRED, 0),
            PREFETCH_STEP_S,
            1.0 / DEFAULT_COST.reload_s,
        )
        return queue_prefetch(self, policy, budget)  # SGLang's next prefill batch completes the loads

    def on_release(self, req: Any, *, checkpointed: bool) -> None:
        super().on_release(req, checkpointed=checkpointed)
        if req.finished():  # else retracted: back in the queue, to finish or be aborted later
            self._release(req.rid)

    def release_aborted_request(self, request: Any) -> None:
        """SGLang drops an aborted request's state (`request`: its CacheRequestHandle); one aborted in the queue
        (its client gone, `abort_request`) held no KV and never reaches on_release."""
        super().release_aborted_request(request)
        self._release(request.rid)

    def _release(self, rid: str) -> None:
        """The request `rid` is over (finished or aborted). Once its call is, the policy releases it: its workflow's
        lease runs from now, its agent waits no more, and an untagged call's own workflow ends."""
        tags = self._requests.pop(rid, None)
        last = self.calls.leave(rid)
        if tags is None or not last:
            return
        self._consult("a request's release", self.policy.on_release, tags, self.now)
        if tags.implicit:
            self._consult("a workflow's end", self.policy.on_end, tags.key, self.now)

    # -- control

    def expire(self, ts: float) -> int:
        """The HTTP process's clock tick: retire workflows whose lease ran out, with no request needed."""
        self.now = max(self.now, ts)
        return self._consult("expiring leases", self.policy.expire, self.now) or 0

    def end_workflow(self, key: WorkflowKey, ts: float) -> bool:
        self.now = max(self.now, ts)
        tenant = key.tenant
        ended = bool(self._consult("a workflow's end", self.policy.on_end, key, self.now))
        if ended:
            self._count("ended_workflows", tenant=tenant)
            self.workflows.on_end(key)
        else:
            self._count("unknown_end_events", tenant=tenant)
        return ended

    def client_events(self, tenant: str, ts: float, events: list[list[Any]]) -> int:
        """A client's events (each [type, *fields], checked in the HTTP process: client_events.py), heard by the
        policy in the order they happened, each workflow, agent and app scoped to `tenant` as a tagged request's
        are (Tags: the workflow key, the agent identity; an app as Tags.app_identity)."""
        self.now = max(self.now, ts)
        principal = principal_of(tenant)
        for kind, *fields in events:
            if kind == Plan.TYPE:
                app, plan = fields
                scoped = scoped_plan(plan_fields(plan), principal)
                self._consult("a plan", self.policy.on_plan, scoped_agent(principal, app), scoped, self.now)
            elif kind == "next":
                workflow, agents = fields
                named = tuple(scoped_agent(principal, a) for a in agents)
                self._consult("a next event", self.policy.on_next, WorkflowKey(tenant, workflow), named, self.now)
            elif kind == "agent_done":
                workflow, agent = fields
                key, identity = WorkflowKey(tenant, workflow), scoped_agent(principal, agent)
                self._consult("an agent done", self.policy.on_agent_done, key, identity, self.now)
            else:
                tags = Tags(workflow=fields[0], agent=fields[1], tenant=tenant)
                where, hear = _TOOL_HOOKS[kind]
                self._consult(where, getattr(self.policy, hear), tags.key, tags.identity, fields[2], self.now)
            self._count(kind, tenant=tenant)
        return len(events)

    def _consult(self, where: str, call: Callable[..., Any], *args: Any) -> Any:
        """`call` into the policy's bookkeeping, unless it was dropped; None where it raised (counted)."""
        if self.component.policy is None:
            return None
        try:
            return call(*args)
        except Exception as exc:
            if where not in self.policy_faults:
                logger.error(
                    "agentcache: the %s policy failed in %s; the request is served, and later faults there are"
                    " counted in policy_faults",
                    self.config.policy.text,
                    where,
                    exc_info=exc,
                )
            self._count_fault(where)
            return None

    def _policy_dropped(self, where: str, exc: Exception) -> None:
        logger.error(
            "agentcache: the %s policy failed in %s; this worker evicts by SGLang's LRU from now on and serves"
            " every request",
            self.config.policy.text,
            where,
            exc_info=exc,
        )
        self._count_fault(where)

    def _count_fault(self, where: str) -> None:
        self.policy_faults[where] += 1
        self._count("policy_faults")

    def _count(self, name: str, n: int = 1, metric: str = "event", tenant: str | None = None) -> None:
        self.counters[name] += n
        if tenant is not None:
            self.tenants.count(tenant, name, n)
        if self.metrics is not None:
            (self.metrics.token if metric == "tokens" else self.metrics.event)(name, n)

    def _invalid(self, reason: str, tenant: str) -> None:
        self.invalid_tags[reason] += 1
        self.tenants.count(tenant, f"invalid_tags_{reason}")
        self._count(f"invalid_tags_{reason}")

    def stats(
        self, tenant: str = "", operator: bool = True, page: Page = FIRST_PAGE, decided: dict[str, int] | None = None
    ) -> dict[str, Any]:
        """Server-wide statistics for the operator; for a tenant, its own counts and workflows only (views.py).
        `decided`: the HTTP process's counts of the tool events it skipped and refused."""
        return stats(self, tenant, operator, page, decided or {})


def _nodes_within(path: list[Any], tokens: int) -> int:
    """How many leading nodes of `path` lie entirely within its first `tokens` tokens."""
    depth = 0
    for i, node in enumerate(path):
        depth += len(node.key)
        if depth > tokens:
            return i
    return len(path)


def build_agentcache(ctx: Any) -> UnifiedRadixCache:
    """The factory behind `--radix-cache-backend agentcache`."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    AgentCache.config = PluginConfig.from_env()
    AgentCache.tp_rank = ctx.tp_rank
    ctx.params.tree_core_backend = "python"  # the Rust core cannot take a Python eviction strategy
    ctx.params.component_registry_override = {
        **(ctx.params.component_registry_override or {}),
        FULL: TaggedFullComponent,
    }
    return create_unified_radix_cache(ctx, cache_class=AgentCache)
