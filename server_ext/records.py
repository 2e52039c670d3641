"""What the statistics routes report per workflow and per tenant: bounded in entries and in bytes.

Clients choose workflow ids, agent names and tenants, so nothing here may
grow with what they send: records of the most recent workflows (each with at
most MAX_AGENTS_PER_RECORD agent names, the rest counted together), and the
counters of the most recently active tenants.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from typing import Any

MAX_RECORDS = 10_000
MAX_RECORD_BYTES = 32 << 20  # all records together, by the estimate below
MAX_AGENTS_PER_RECORD = 32
OTHER_AGENTS = "(other agents)"
MAX_TENANTS = 4096
_RECORD_OVERHEAD = 400  # bytes of a record's dicts and counters, before its names
_NAME_OVERHEAD = 120  # bytes per agent entry besides its characters


class WorkflowRecords:
    """Per-workflow records (requests, agents by name with their ids, ended), oldest dropped first."""

    def __init__(self, max_records: int = MAX_RECORDS, max_bytes: int = MAX_RECORD_BYTES):
        self.max_records, self.max_bytes = max_records, max_bytes
        self._records: OrderedDict[Any, dict[str, Any]] = OrderedDict()
        self._sizes: dict[Any, int] = {}
        self.bytes = 0

    def on_request(self, key: Any, agent_name: str | None, agent: str) -> None:
        record = self._records.get(key)
        if record is None:
            record = self._records[key] = {"requests": 0, "agents": {}, "ended": False}
            self._resize(key, _RECORD_OVERHEAD + len(str(key)))
        else:
            self._records.move_to_end(key)
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

    def _resize(self, key: Any, size: int) -> None:
        self.bytes += size - self._sizes.get(key, 0)
        self._sizes[key] = size

    def _trim(self) -> None:
        while len(self._records) > 1 and (len(self._records) > self.max_records or self.bytes > self.max_bytes):
            key, _ = self._records.popitem(last=False)
            self.bytes -= self._sizes.pop(key)

    def __len__(self) -> int:
        return len(self._records)


class TenantCounters:
    """Each tenant's own counters (requests, tokens, ends), for the statistics a tenant may see."""

    def __init__(self, max_tenants: int = MAX_TENANTS):
        self.max_tenants = max_tenants
        self._counters: OrderedDict[str, Counter[str]] = OrderedDict()

    def count(self, tenant: str, name: str, n: int = 1) -> None:
        counters = self._counters.get(tenant)
        if counters is None:
            counters = self._counters[tenant] = Counter()
            if len(self._counters) > self.max_tenants:
                self._counters.popitem(last=False)
        else:
            self._counters.move_to_end(tenant)
        counters[name] += n

    def of(self, tenant: str) -> Counter[str]:
        return self._counters.get(tenant, Counter())

    def __len__(self) -> int:
        return len(self._counters)
