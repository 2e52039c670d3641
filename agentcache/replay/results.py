"""A replay's figures: what the runner computes and the report shows (no SGLang import: the CLI's tables
load this without the ~15 s the runner takes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentcache.trace import Event, Request, ToolEnd

UNLIMITED = "unlimited"  # a cache that never evicts: the ceiling of every policy's hit rate


@dataclass
class ReplayResult:
    policy: str
    capacity: int
    requests: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    recomputed_tokens: int = 0
    oversized_requests: int = 0
    host_capacity: int = 0
    host_hit_tokens: int = 0  # prompt tokens loaded back from host memory instead of recomputed
    prefetched_tokens: int = 0  # tokens a prefetch (or warm-up request) brought to the device
    prefetch_used_tokens: int = 0  # of those, tokens a request then read
    prefetch_wasted_tokens: int = 0  # of those, tokens evicted before any request read them
    modelled_latency_s: float = 0.0
    gap_closed: float | None = None
    evicted_tokens: dict[str, int] = field(default_factory=dict)
    replay_wall_s: float = 0.0
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (ts, hit rate of the window ending there)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_json(self, *, timeline: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out["hit_rate"] = self.hit_rate
        if not timeline:
            del out["timeline"]
        return out


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile of values sorted ascending (the value at rank floor(q n)); 0.0 of none."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def calls_after_tools(events: Iterable[Event]) -> set[int]:
    """The requests (places among the trace's requests) that follow a tool: each the agent's first call in its
    workflow after its tool_end, the call that reads the paused agent's prompt and answer back (what a cache that
    lost them during the pause makes it compute again)."""
    waiting: set[tuple[str, str]] = set()  # (workflow, agent) whose tool ended and whose next call has not come
    after: set[int] = set()
    index = 0
    for e in events:
        if isinstance(e, ToolEnd):
            waiting.add((e.workflow, e.agent))
        elif isinstance(e, Request):
            if (e.workflow, e.agent) in waiting:
                waiting.discard((e.workflow, e.agent))
                after.add(index)
            index += 1
    return after
