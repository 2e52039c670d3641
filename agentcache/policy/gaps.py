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
        self._total = 0.0  # sum of the window, kept as gaps come and go: the policy reads the mean for every key
        # sums of the longest gaps ([k]: of the k + 1 longest), rebuilt lazily
        self._longest_sums: list[float] | None = None

    def add(self, gap: float) -> None:
        if gap < 0:
            return
        self._recent.append(gap)
        insort(self._sorted, gap)
        self._total += gap
        if len(self._recent) > self.window:
            old = self._recent.popleft()
            del self._sorted[bisect_right(self._sorted, old) - 1]
            self._total -= old
        self._longest_sums = None

    @property
    def count(self) -> int:
        return len(self._sorted)

    @property
    def mean(self) -> float:
        return self._total / len(self._sorted) if self._sorted else 0.0

    def quantile(self, q: float) -> float:
        """The q-quantile of the window (its smallest value above a share q of it); 0.0 when empty."""
        gaps = self._sorted
        return gaps[min(int(q * len(gaps)), len(gaps) - 1)] if gaps else 0.0

    def residual(self, idle: float) -> float:
        """E[G - idle | G > idle]; `idle` itself when no recorded gap was ever that long."""
        gaps = self._sorted
        count = len(gaps)
        if not count:
            return 0.0
        i = bisect_right(gaps, idle)
        if i == count:
            return idle  # longer than anything seen: it may never come back
        if self._longest_sums is not None:
            longer = self._longest_sums[count - 1 - i]
        elif i * 8 < count:  # a workflow asked about just after its request, as after every gap added
            longer = self._total - sum(gaps[:i])
        else:
            self._longest_sums = list(accumulate(reversed(gaps)))
            longer = self._longest_sums[count - 1 - i]
        return longer / (count - i) - idle
