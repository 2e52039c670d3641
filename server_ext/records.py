"""What the statistics routes report per workflow and per tenant: bounded in entries and in bytes.

Clients choose workflow ids, agent names and tenants, so nothing here may
grow with what they send: records of the most recent workflows (each with at
most MAX_AGENTS_PER_RECORD agent names, the rest counted together), and the
counters of the most recently active tenants. Neither lets one tenant push
out another's: a keyed tenant (the principal of agentcache.tags.principal_of)
has caps of its own, and at the server's cap the principal holding the most
loses its oldest entry.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterator
from typing import Any

from agentcache.tags import principal_of

MAX_RECORDS = 10_000
MAX_RECORD_BYTES = 32 << 20  # all records together, by the estimate below
MAX_AGENTS_PER_RECORD = 32
OTHER_AGENTS = "(other agents)"
MAX_TENANTS = 4096
MAX_RECORDS_PER_TENANT = 2_000  # a keyed tenant's own records (the operator's have the server's cap alone)
MAX_LABELS_PER_TENANT = 256  # a keyed tenant's sub-tenant labels with counters of their own
_RECORD_OVERHEAD = 400  # bytes of a record's dicts and counters, before its names
_NAME_OVERHEAD = 120  # bytes per agent entry besides its characters


class ByPrincipal:
    """Entries grouped by their principal, least recently used first in each: who loses one at a cap."""

    def __init__(self) -> None:
        self._of: dict[str, OrderedDict[Any, None]] = {}

    def touch(self, principal: str, key: Any) -> None:
        keys = self._of.get(principal)
        if keys is None:
            keys = self._of[principal] = OrderedDict()
        keys[key] = None
        keys.move_to_end(key)

    def forget(self, principal: str, key: Any) -> None:
        keys = self._of.get(principal)
        if keys is not None:
            keys.pop(key, None)
            if not keys:
                del self._of[principal]

    def count(self, principal: str) -> int:
        keys = self._of.get(principal)
        return len(keys) if keys else 0

    def recent(self, principal: str) -> Iterator[Any]:
        """`principal`'s entries, most recent first."""
        return reversed(self._of.get(principal) or OrderedDict())

    def oldest(self, principal: str | None = None) -> Any:
        """The least recent entry of `principal`, or (None) of the principal holding the most."""
        keys = self._of[principal] if principal is not None else max(self._of.values(), key=len)
        return next(iter(keys))


class WorkflowRecords:
    """Per-workflow records (requests, agents by name with their ids, ended), oldest dropped first."""

    def __init__(
        self,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_RECORD_BYTES,
        max_per_tenant: int = MAX_RECORDS_PER_TENANT,
    ):
        self.max_records, self.max_bytes, self.max_per_tenant = max_records, max_bytes, max_per_tenant
        self._records: OrderedDict[Any, dict[str, Any]] = OrderedDict()
        self._sizes: dict[Any, int] = {}
        self._principals = ByPrincipal()
        self.bytes = 0

    def on_request(self, key: Any, agent_name: str | None, agent: str) -> None:
        """A request of the workflow `key` (a WorkflowKey: its tenant, its id)."""
        principal = principal_of(key.tenant)
        record = self._records.get(key)
        if record is None:
            if principal and self._principals.count(principal) >= self.max_per_tenant:
                self._drop(self._principals.oldest(principal))
            record = self._records[key] = {"requests": 0, "agents": {}, "ended": False}
            self._resize(key, _RECORD_OVERHEAD + len(str(key)))
        else:
            self._records.move_to_end(key)
        self._principals.touch(principal, key)
        record["requests"] += 1
        agents = record["agents"]
        name = agent_name or agent
        if name not in agents and len(agents) >= MAX_AGENTS_PER_RECORD:
            name = OTHER_AGENTS
        if name not in agents:
            self._resize(key, self._sizes[key] + _NAME_OVERHEAD + len(name))
        agents[name] = agents.get(name, 0) + 1
        if agent_name and name == agent_name:
            ids = record.setdefault("agent_ids", {})
            if agent_name not in ids:
                self._resize(key, self._sizes[key] + _NAME_OVERHEAD + len(agent))
            ids[agent_name] = agent
        self._trim()

    def on_end(self, key: Any) -> None:
        record = self._records.get(key)
        if record is not None:
            record["ended"] = True

    def get(self, key: Any) -> dict[str, Any] | None:
        return self._records.get(key)

    def items(self) -> Any:
        return self._records.items()

    def recent(self, principal: str | None = None) -> Iterator[tuple[Any, dict[str, Any]]]:
        """(key, record), most recent first: every one, or (an index, no scan) those of `principal`'s workflows."""
        records = self._records
        keys = reversed(records) if principal is None else self._principals.recent(principal)
        return ((key, records[key]) for key in keys)

    def _resize(self, key: Any, size: int) -> None:
        self.bytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size

    def _trim(self) -> None:
        while len(self._records) > 1 and (len(self._records) > self.max_records or self.bytes > self.max_bytes):
            self._drop(self._principals.oldest())

    def _drop(self, key: Any) -> None:
        del self._records[key]
        self.bytes -= self._sizes.pop(key)
        self._principals.forget(principal_of(key.tenant), key)

    def __len__(self) -> int:
        return len(self._records)


class TenantCounters:
    """Each tenant's own counters (requests, tokens, ends), for the statistics a tenant may see."""

    def __init__(self, max_tenants: int = MAX_TENANTS, max_labels_per_tenant: int = MAX_LABELS_PER_TENANT):
        self.max_tenants, self.max_labels_per_tenant = max_tenants, max_labels_per_tenant
        self._counters: dict[str, Counter[str]] = {}
        self._principals = ByPrincipal()

    def count(self, tenant: str, name: str, n: int = 1) -> None:
        principal = principal_of(tenant)
        counters = self._counters.get(tenant)
        if counters is None:
            if principal and self._principals.count(principal) >= self.max_labels_per_tenant:
                self._drop(self._principals.oldest(principal))
            elif len(self._counters) >= self.max_tenants:
                self._drop(self._principals.oldest())
            counters = self._counters[tenant] = Counter()
        self._principals.touch(principal, tenant)
        counters[name] += n

    def _drop(self, tenant: str) -> None:
        del self._counters[tenant]
        self._principals.forget(principal_of(tenant), tenant)

    def of(self, tenant: str) -> Counter[str]:
        return self._counters.get(tenant, Counter())

    def __len__(self) -> int:
        return len(self._counters)
