"""What the read-only control routes answer (statistics, a workflow's view), from indexes kept as requests are
tagged: no answer walks the radix tree or every workflow, and none lists more than a page.

They run in the scheduler's thread (server_ext/control.py), where every millisecond is one that every tenant's
decoding waits; so each answer's work is bounded by its page and its indexes, never by what clients sent:

- a workflow's view reads the nodes its requests were tagged on (:class:`WorkflowNodes`: the latest
  MAX_NODES_PER_WORKFLOW of each of the MAX_INDEXED_WORKFLOWS most recently tagged workflows) and their
  ancestors, where the tree split them;
- a tenant's statistics read its own counters and its principal's workflow records (server_ext/records.py:
  at most 2,000 for a keyed tenant);
- a list of workflows is a page, most recent first (control_limits.Page: ``offset`` and ``limit``, at most
  1,000), with ``workflows_total`` and ``next_offset`` (None on the last page).

The operator's ``held_tokens`` alone still walks the tree: a node's class changes with its workflows' leases,
which no index follows. The operator's key alone reaches it, rate-limited like every read route
(control_limits.py).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from agentcache import compiled
from agentcache.engine.adapter import held_by_class
from agentcache.policy.nodes import TAGS_ATTR
from agentcache.policy.pbkv import PBKVPolicy
from agentcache.server_ext.control_limits import Page
from agentcache.tags import WorkflowKey, principal_of

MAX_INDEXED_WORKFLOWS = 4096
MAX_NODES_PER_WORKFLOW = 64


class WorkflowNodes:
    """The radix nodes each workflow's requests were tagged on (their ids, most recent last): what a view of the
    workflow reads instead of the tree. Bounded: the latest `max_nodes` of the `max_workflows` most recently
    tagged workflows (a node's ancestors need no entry: the view walks up to them)."""

    def __init__(self, max_workflows: int = MAX_INDEXED_WORKFLOWS, max_nodes: int = MAX_NODES_PER_WORKFLOW):
        self.max_workflows, self.max_nodes = max_workflows, max_nodes
        self._of: OrderedDict[WorkflowKey, OrderedDict[Any, None]] = OrderedDict()

    def tagged(self, key: WorkflowKey, path: list[Any]) -> None:
        nodes = self._of.get(key)
        if nodes is None:
            nodes = self._of[key] = OrderedDict()
            if len(self._of) > self.max_workflows:
                self._of.popitem(last=False)
        else:
            self._of.move_to_end(key)
        for node in path:
            nodes[node.id] = None
            nodes.move_to_end(node.id)
        while len(nodes) > self.max_nodes:
            nodes.popitem(last=False)

    def cached(self, cache: Any, key: WorkflowKey) -> Iterator[Any]:
        """The device-held nodes tagged with `key` among those indexed and their ancestors, each once."""
        ids = self._of.get(key)
        if not ids:
            return
        core = cache.tree_core
        root, seen = core.root_node, set()
        for node_id in list(ids):
            try:
                node = core.node_by_id(node_id)
            except KeyError:  # the tree deleted it (evicted)
                del ids[node_id]
                continue
            while node is not None and node is not root and node.id not in seen:
                seen.add(node.id)
                tags = getattr(node, TAGS_ATTR, None)
                if not node.evicted and tags is not None and key in tags.workflows:
                    yield node
                node = node.parent


def workflow_view(cache: Any, key: WorkflowKey) -> dict[str, Any]:
    """What the cache holds for one workflow: its record and the nodes it touched (a debugging view)."""
    nodes = tokens = fixed_tokens = 0
    agents: set[str] = set()
    for node in cache.views.cached(cache, key):
        tags = getattr(node, TAGS_ATTR)
        nodes += 1
        tokens += len(node.key)
        fixed_tokens += len(node.key) if tags.fixed_agents else 0
        agents |= tags.workflows[key].keys()
    record = cache.workflows.get(key) or {}
    return {
        "workflow": key.id,
        "active": cache.policy.registry.is_active(key),
        "requests": record.get("requests", 0),
        "ended": record.get("ended", False),
        "agents": record.get("agents", {}),
        "cached_nodes": nodes,
        "cached_tokens": tokens,
        "cached_fixed_tokens": fixed_tokens,
        "cached_agents": sorted(agents),
    }


def stats(cache: Any, tenant: str, operator: bool, page: Page, decided: dict[str, int]) -> dict[str, Any]:
    """Server-wide statistics for the operator; for a tenant, its own counts and workflows only. `decided`: the
    HTTP process's counts of client events it skipped and refused (its decisions: server_ext/client_events.py)."""
    if not operator:
        return tenant_stats(cache, tenant, page, decided)
    registry, c, component = cache.policy.registry, cache.counters, cache.component
    records = cache.workflows
    dropped = component.policy is None
    return {
        "policy": cache.config.policy.text + (" (dropped after a fault: evicting by lru)" if dropped else ""),
        "scope": "server",
        "policy_core": compiled.active(),
        "held_tokens": cache._consult("statistics", held_by_class, cache, cache.policy) or {},
        "active_workflows": len(registry),
        "retired_workflows": registry.retired_count,
        "expired_workflows": registry.expired_count,
        "in_flight_requests": len(cache._requests),
        "lost_releases": registry.lost_releases,
        **_traffic(c, dict(cache.invalid_tags), decided),
        "forecasters": cache._consult("statistics", cache.policy.forecast_stats) or {},
        "pauses": cache._consult("statistics", cache.policy.pause_counts) or {"open": 0, "cut_off": 0},
        "predictor_faults": dict(cache.policy.predictor.faults) if isinstance(cache.policy, PBKVPolicy) else {},
        "policy_faults": dict(cache.policy_faults),
        "prefetch": {
            "mode": cache.config.prefetch if cache.cache_controller is not None else "off (no host tier)",
            "prefetched_tokens": c["prefetched_tokens"],
            "used_tokens": c["prefetch_used_tokens"],
            "wasted_tokens": component.prefetch_wasted_tokens,
        },
        "evicted_tokens": dict(component.evicted_tokens),
        "evicted_nodes": dict(component.evicted_nodes),
        "cached_tokens": cache.total_size()[0],
        "free_tokens": cache.token_to_kv_pool_allocator.available_size(),
        "tenants": len(cache.tenants),
        **page.take(((str(k), v) for k, v in records.recent()), len(records)),
    }


def tenant_stats(cache: Any, tenant: str, page: Page, decided: dict[str, int]) -> dict[str, Any]:
    """What one tenant may see: counts of its own traffic and its own workflows, nothing server-wide."""
    c = cache.tenants.of(tenant)
    prefix = "invalid_tags_"
    is_active = cache.policy.registry.is_active
    own = [(k, v) for k, v in cache.workflows.recent(principal_of(tenant)) if k.tenant == tenant]
    return {
        "policy": cache.config.policy.text,
        "scope": "tenant",
        "active_workflows": sum(1 for k, _ in own if is_active(k)),
        **_traffic(c, {k[len(prefix) :]: v for k, v in c.items() if k.startswith(prefix)}, decided),
        **page.take(((k.id, v) for k, v in own), len(own)),
    }


def _traffic(c: Any, invalid_tags: dict[str, int], decided: dict[str, int]) -> dict[str, Any]:
    """The request, token, end and client event counts both scopes report, from counters `c` (the scheduler's) and
    `decided` (the HTTP process's: events skipped and refused)."""
    return {
        "requests": c["requests"],
        "tagged_requests": c["tagged_requests"],
        "untagged_requests": c["untagged_requests"],
        "invalid_tags": invalid_tags,
        "prompt_tokens": c["prompt_tokens"],
        "hit_tokens": c["hit_tokens"],
        "host_hit_tokens": c["host_hit_tokens"],
        "hit_rate": c["hit_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0,
        "ended_workflows": c["ended_workflows"],
        "unknown_end_events": c["unknown_end_events"],
        "tool_events": {
            "tool_start": c["tool_start"],
            "tool_end": c["tool_end"],
            "next": c["next"],
            "agent_done": c["agent_done"],
            "plan": c["plan"],
            "skipped": int(decided.get("skipped", 0)),
            "refused": int(decided.get("refused", 0)),
        },
    }
