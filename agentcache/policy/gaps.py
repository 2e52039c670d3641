"""How long until a workflow's next request, from the gaps between requests seen so far.

Keeps a bounded window of recent gaps between consecutive requests of the same
workflow and answers the mean residual time E[G - idle | G > idle]: how much
longer a workflow that has been idle for `idle` seconds is expected to stay
idle. Regular gaps make a just-served workflow the one due last (as Belady
would see it); heavy-tailed gaps make a long-idle workflow the one due last
(it has likely stalled). Neither needs a tuned constant.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque
from itertools import accumulate


class GapModel:
    def __init__(self, window: int = 512):
        self.window = window
        self._recent: deque[float] = deque()
        self._sorted: list[float] = []
        self._suffix: list[float] | None = None  # suffix sums of _sorted, rebuilt lazily
        self._mean: float | None = None  # kept until the next gap: the policy reads it for every key it computes

    def add(self, gap: float) -> None:
        if gap < 0:
            return
        self._recent.append(gap)
        insort(self._sorted, gap)
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect_right(self._sorted, old) - 1]
        self._suffix = self._mean = None

    @property
    def count(self) -> int:
        return len(self._sorted)

    @property
    def mean(self) -> float:
        if self._mean is None:
            self._mean = sum(self._sorted) / len(self._sorted) if self._sorted else 0.0
        return self._mean

    def residual(self, idle: float) -> float:
        """E[G - idle | G > idle]; `idle` itself when no recorded gap was ever that long."""
        gaps = self._sorted
        if not gaps:
            return 0.0
        if self._suffix is None:
            self._suffix = list(accumulate(reversed(gaps)))[::-1]
        i = bisect_right(gaps, idle)
        if i == len(gaps):
            return idle  # longer than anything seen: it may never come back
        longer = len(gaps) - i
        return self._suffix[i] / longer - idle
