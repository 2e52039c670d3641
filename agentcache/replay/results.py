"""A replay's figures: what the runner computes and the report shows (no SGLang import: the CLI's tables
load this without the ~15 s the runner takes)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
