"""What bounds a read-only control call (a workflow's view, the statistics): how often a tenant may make one,
and how much one lists.

Each call is answered in the scheduler's thread, where its time is time every tenant's decoding waits, so a
tenant's calls go through a token bucket per principal (the holder of its key, agentcache.tags.principal_of:
a sub-tenant label is no new bucket): AGENTCACHE_CONTROL_RATE calls a second (default 20), in bursts of twice
that. Past it the route answers 429 with Retry-After. Ends and health checks are not limited: an end is
constant work, and the SDK sends one per workflow. Tool events (``POST /agentcache/v1/events``) are work per
event, many per workflow: each principal may send AGENTCACHE_EVENT_RATE of them a second (default 4,000), in
bursts of twice that (never under one full batch), by a bucket of their own.
"""

from __future__ import annotations

import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice
from typing import Any

CONTROL_RATE_ENV = "AGENTCACHE_CONTROL_RATE"
DEFAULT_RATE = 20.0  # calls a second, per principal
EVENT_RATE_ENV = "AGENTCACHE_EVENT_RATE"
# Tool events a second, per principal: two per tool call, so 2,000 tool calls a second, each event constant work
# for the policy on the scheduler thread.
DEFAULT_EVENT_RATE = 4000.0
MAX_BUCKETS = 4096  # principals with a bucket; the one idle longest goes first (its bucket would be full)
DEFAULT_PAGE = 100
MAX_PAGE = 1000


class RateLimiter:
    """A token bucket per caller: `rate` calls a second, bursts of `burst`."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        if rate <= 0 or burst < 1:
            raise ValueError(f"a rate limit needs rate > 0 and burst >= 1, got {rate} and {burst}")
        self.rate, self.burst, self.clock = rate, burst, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # caller -> (tokens, when counted)

    @classmethod
    def from_env(
        cls, env: str = CONTROL_RATE_ENV, default: float = DEFAULT_RATE, least_burst: float = 1.0
    ) -> RateLimiter:
        """`env`'s rate a second (`default` where unset or no positive number), in bursts of twice that and at
        least `least_burst`."""
        raw = os.environ.get(env)
        try:
            rate = float(raw) if raw else default
        except ValueError:
            rate = default
        rate = rate if math.isfinite(rate) and rate > 0 else default
        return cls(rate, max(2.0 * rate, least_burst))

    def take(self, caller: str, cost: float = 1.0) -> float:
        """0.0 when `caller` may make a call of `cost` (at most the burst) now (it is counted); else the seconds
        until it may."""
        now = self.clock()
        tokens, when = self._buckets.pop(caller, (self.burst, now))
        tokens = min(self.burst, tokens + (now - when) * self.rate)
        wait = 0.0
        if tokens >= cost:
            tokens -= cost
        else:
            wait = (cost - tokens) / self.rate
        self._buckets[caller] = (tokens, now)
        if len(self._buckets) > MAX_BUCKETS:
            self._buckets.popitem(last=False)
        return wait


@dataclass(frozen=True, slots=True)
class Page:
    """Which workflows a list shows: `limit` of them from `offset`, most recent first."""

    offset: int = 0
    limit: int = DEFAULT_PAGE

    @classmethod
    def parse(cls, offset: str | None, limit: str | None) -> Page:
        """The page that query parameters ask for; ValueError naming the bound they break."""
        try:
            page = cls(int(offset) if offset else 0, int(limit) if limit else DEFAULT_PAGE)
        except ValueError:
            raise ValueError("offset and limit must be whole numbers") from None
        if page.offset < 0 or not 1 <= page.limit <= MAX_PAGE:
            raise ValueError(f"offset must be >= 0 and limit between 1 and {MAX_PAGE}")
        return page

    @classmethod
    def of(cls, payload: dict[str, Any]) -> Page:
        """The page a control call carries (the route parsed it; kept within bounds all the same)."""
        limit = min(max(int(payload.get("limit", DEFAULT_PAGE)), 1), MAX_PAGE)
        return cls(max(int(payload.get("offset", 0)), 0), limit)

    def take(self, items: Any, total: int) -> dict[str, Any]:
        """This page of `items` ((name, record) pairs, most recent first, `total` of them), and where the next
        page starts (None: this is the last)."""
        end = self.offset + self.limit
        return {
            "workflows": dict(islice(items, self.offset, end)),
            "workflows_total": total,
            "next_offset": end if end < total else None,
        }


FIRST_PAGE = Page()
