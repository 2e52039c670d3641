"""pbkv's switchable ingredients (docs/design/policy.md says what each is worth), and its default forecaster."""

from __future__ import annotations

from dataclasses import dataclass

from agentcache.predictor import Predictor, PredictorSpec
from agentcache.predictor.markov import DEFAULT_ORDER


@dataclass(frozen=True)
class Ingredients:
    lifecycle: bool = True
    retired_evidence: bool = True
    retired_ages: bool = True
    fixed_by_forecast: bool = True
    arrivals: bool = True
    current_paths: bool = True
    timing: bool = True
    evidence: bool = True
    cost: bool = False
    fallback: bool = True
    pending: bool = True
    reuse: bool = True
    tools: bool = True
    plan: bool = True  # the app's plan, `next` and `agent_done` (issue 53); off: as if none came


DEFAULT = Ingredients()  # pbkv's own: every ingredient but cost
PAPER = Ingredients(
    retired_evidence=False,
    retired_ages=False,
    fixed_by_forecast=False,
    arrivals=False,
    current_paths=False,
    timing=False,
    evidence=False,
    cost=False,
    fallback=False,
    pending=False,
    reuse=False,
    tools=False,
    plan=False,
)


def default_forecaster(order: int = DEFAULT_ORDER) -> Predictor:
    """pbkv's own forecaster (of `order`): what it consults unless given another; the one `markov-n:<order>`
    names (re-rolled at the serving pace, over the spec's horizon)."""
    return PredictorSpec("markov-n", order=order).build()
