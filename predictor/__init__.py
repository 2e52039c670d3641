"""Forecasts of each workflow's next K agents, behind one interface (see base.py).

The torch-backed names (NeuralPredictor, NeuralConfig) load on first use, so
the policy core imports this package without torch installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentcache.predictor.base import END, START, Forecast, Predictor
from agentcache.predictor.markov import MarkovPredictor
from agentcache.predictor.noise import NoisyPredictor
from agentcache.predictor.static import StaticGraphPredictor
from agentcache.trace import Meta

if TYPE_CHECKING:
    from agentcache.predictor.neural import NeuralConfig, NeuralPredictor

SPECS = "markov, markov-n:N, static, neural:PATH.pt, noise:LAMBDA:<spec>"
_LAZY = {"NeuralPredictor", "NeuralConfig"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from agentcache.predictor import neural

        return getattr(neural, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_predictor(spec: str, trace_meta: Meta | None = None, *, horizon: int = 3) -> Predictor:
    """The predictor a spec names: markov | markov-n:N | static | neural:PATH.pt | noise:LAMBDA:<spec>.

    `trace_meta` supplies the call graph of "static"; `horizon` sets K for the
    online predictors (a neural model keeps the K it was trained with).
    """
    kind, _, rest = spec.partition(":")
    if kind == "markov" and not rest:
        return MarkovPredictor(order=1, horizon=horizon)
    if kind == "markov-n":
        try:
            order = int(rest)
        except ValueError:
            raise ValueError(f"predictor {spec!r}: markov-n needs an integer order, like markov-n:3") from None
        return MarkovPredictor(order=order, horizon=horizon)
    if kind == "static" and not rest:
        return StaticGraphPredictor.from_meta(trace_meta, horizon=horizon)
    if kind == "neural":
        if not rest:
            raise ValueError(f"predictor {spec!r}: neural needs a model file, like neural:model.pt")
        try:
            from agentcache.predictor.neural import NeuralPredictor
        except ImportError:
            raise ValueError("the neural predictor needs torch: pip install 'agentcache[predictor]'") from None
        return NeuralPredictor.load(rest)
    if kind == "noise":
        lam_text, _, inner = rest.partition(":")
        try:
            lam = float(lam_text)
        except ValueError:
            raise ValueError(
                f"predictor {spec!r}: noise needs a number and a predictor, like noise:0.2:markov"
            ) from None
        if not inner:
            raise ValueError(f"predictor {spec!r}: noise needs an inner predictor, like noise:0.2:markov")
        return NoisyPredictor(load_predictor(inner, trace_meta, horizon=horizon), lam)
    raise ValueError(f"unknown predictor {spec!r}; expected one of: {SPECS}")


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
    "load_predictor",
    "SPECS",
]
