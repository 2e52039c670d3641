"""Conservative prefetch planning (PBKV section 4.3): spend only idle space and idle bandwidth.

    S = min(S_space, S_bandwidth)
    S_space     = free slots + slots held only by ended workflows (never active cache)
    S_bandwidth = idle time x host-to-device tokens per second

Candidates are the host-only parts of the cache each forecast says will be
read at the very next step: an active workflow's own history for the agent it
will call next, and the fixed prompt of an agent some workflow will call next.
They are ranked by one-step reuse value (expected reads at the next step) and
loaded greedily until the budget is spent. The aggressive variant, kept for
comparison, ignores the space limit and so may evict active cache to make
room: under prediction noise that is exactly what makes it lose.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

CONSERVATIVE = "conservative"
AGGRESSIVE = "aggressive"
MODES = (CONSERVATIVE, AGGRESSIVE)


class Candidate(NamedTuple):
    node: Any  # the deepest node to load back (its host-only ancestors come with it)
    value: float  # expected reads at the next step
    fixed_agent: str | None = None  # set when the node ends this agent's fixed prompt


def budget(mode: str, free_tokens: int, retired_tokens: int, idle_s: float, tokens_per_s: float) -> int:
    """Tokens a prefetch may load now."""
    bandwidth = int(max(idle_s, 0.0) * tokens_per_s)
    if mode == AGGRESSIVE:
        return bandwidth
    if mode != CONSERVATIVE:
        raise ValueError(f"unknown prefetch mode {mode!r}; choose from {', '.join(MODES)}")
    return min(free_tokens + retired_tokens, bandwidth)


def plan(candidates: Iterable[Candidate], budget_tokens: int, cost: Callable[[Any], int]) -> list[Any]:
    """The candidates to load, most valuable first, while their loading cost fits the budget."""
    merged: dict[int, Candidate] = {}
    for c in candidates:
        if c.value <= 0.0:
            continue
        seen = merged.get(id(c.node))
        merged[id(c.node)] = c if seen is None else c._replace(value=seen.value + c.value)
    chosen = []
    left = budget_tokens
    for c in sorted(merged.values(), key=lambda c: c.value, reverse=True):
        tokens = cost(c.node)
        if 0 < tokens <= left:
            chosen.append(c.node)
            left -= tokens
    return chosen
