"""The predictor interface: a workflow's state in, K distributions over agents plus END out.

Row k of a forecast is the *unconditional* distribution of the workflow's
k-th next request: END is absorbing, so its mass never shrinks from one row to
the next, and PBKV's survival-weighted ``s_w^(k) P_w^(k)(a)`` is simply row k's
probability of `a`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

END = "<END>"  # the workflow finished: absorbing
START = "<START>"  # marks the beginning of a workflow's path in contexts; never predicted

Forecast = list[dict[str, float]]  # K rows; each maps agent (or END) -> probability, summing to 1


class Predictor(ABC):
    """Forecasts a workflow's next `horizon` agents from the agents it called so far."""

    name: str = "predictor"

    def __init__(self, horizon: int = 3):
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = horizon

    @abstractmethod
    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        """K rows for a workflow whose requests so far came from the agents in `path` (oldest first)."""

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        """Learn online that a workflow at `path` went on to `next_agent` (END when it finished)."""
