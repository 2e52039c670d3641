"""Forecasts of each workflow's next K agents, behind one interface (see base.py).

The torch-backed names (NeuralPredictor, NeuralConfig) load on first use, so
the policy core imports this package without torch installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentcache.predictor.base import END, START, Forecast, Predictor
from agentcache.predictor.markov import MarkovPredictor
from agentcache.predictor.noise import NoisyPredictor
from agentcache.predictor.spec import SPECS, PredictorSpec
from agentcache.predictor.static import StaticGraphPredictor

if TYPE_CHECKING:
    from agentcache.predictor.neural import NeuralConfig, NeuralPredictor

_LAZY = {"NeuralPredictor", "NeuralConfig"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from agentcache.predictor import neural

        return getattr(neural, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "END",
    "START",
    "Forecast",
    "Predictor",
    "MarkovPredictor",
    "StaticGraphPredictor",
    "NoisyPredictor",
    "NeuralPredictor",
    "NeuralConfig",
    "PredictorSpec",
    "SPECS",
]
