"""Predictor specs (``markov``, ``markov-n:3``, ``static``, ``neural:model.pt``, ``noise:0.2:markov``, ``oracle``),
parsed once.

The CLI, the replay and the server all take a spec string from a user; each
parses it here into a :class:`PredictorSpec` as soon as it gets it (so a bad
spec fails at once, with what is wrong) and builds predictors from that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agentcache.predictor.base import DEFAULT_HORIZON, Predictor

if TYPE_CHECKING:
    from agentcache.trace import Trace

SPECS = "markov, markov-n:N, static, neural:PATH.pt, noise:LAMBDA:<spec>, oracle (replay only)"


@dataclass(frozen=True)
class PredictorSpec:
    kind: str  # markov | markov-n | static | neural | noise | oracle
    order: int = 1  # markov-n
    path: str | None = None  # neural: the model file
    noise: float = 0.0  # noise: lambda
    inner: PredictorSpec | None = None  # noise: the predictor it perturbs

    @classmethod
    def parse(cls, text: str) -> PredictorSpec:
        """Raises ValueError naming what is wrong."""
        kind, _, rest = text.partition(":")
        if kind == "markov" and not rest:
            return cls("markov")
        if kind == "markov-n":
            try:
                order = int(rest)
            except ValueError:
                raise ValueError(f"predictor {text!r}: markov-n needs an integer order, like markov-n:3") from None
            if order < 1:
                raise ValueError(f"predictor {text!r}: the order must be >= 1")
            return cls("markov-n", order=order)
        if kind == "static" and not rest:
            return cls("static")
        if kind == "oracle" and not rest:
            return cls("oracle")
        if kind == "neural":
            if not rest:
                raise ValueError(f"predictor {text!r}: neural needs a model file, like neural:model.pt")
            return cls("neural", path=rest)
        if kind == "noise":
            lam_text, _, inner = rest.partition(":")
            try:
                lam = float(lam_text)
            except ValueError:
                raise ValueError(
                    f"predictor {text!r}: noise needs a number and a predictor, like noise:0.2:markov"
                ) from None
            if not 0.0 <= lam <= 1.0:
                raise ValueError(f"predictor {text!r}: noise lam must be in [0, 1]")
            if not inner:
                raise ValueError(f"predictor {text!r}: noise needs an inner predictor, like noise:0.2:markov")
            perturbed = cls.parse(inner)
            if perturbed.offline:  # noise spreads over the outcomes a forecast names: only the true ones here
                raise ValueError(f"predictor {text!r}: noise over the oracle would never name a wrong agent")
            return cls("noise", noise=lam, inner=perturbed)
        raise ValueError(f"unknown predictor {text!r}; expected one of: {SPECS}")

    @property
    def offline(self) -> bool:
        """Whether it reads the future of a trace (the oracle): one replay of it, in order."""
        return self.kind == "oracle"

    def __str__(self) -> str:
        if self.kind == "markov-n":
            return f"markov-n:{self.order}"
        if self.kind == "neural":
            return f"neural:{self.path}"
        if self.kind == "noise":
            return f"noise:{self.noise:g}:{self.inner}"
        return self.kind

    def build(
        self,
        call_graph: Mapping[str, Sequence[str]] | None = None,
        *,
        horizon: int = DEFAULT_HORIZON,
        call_graph_source: str = "the call graph",
        trace: Trace | None = None,
    ) -> Predictor:
        """A new predictor; `call_graph` is the static one's, `trace` the one the oracle replays (it reads
        each workflow's future there). Raises ValueError (or OSError) naming the problem.

        `horizon` sets K for the online predictors (a neural model keeps the K it was trained with);
        `call_graph_source` names where the graph came from, in messages about agents it does not know.
        A Markov forecaster re-rolls at the serving pace (SERVING_REFRESH_EVERY), so `markov-n:6` is exactly
        pbkv's own forecaster.
        """
        from agentcache.predictor.markov import (
            DEFAULT_ORDER,
            SERVING_REFRESH_EVERY,
            SERVING_REFRESH_SHARE,
            MarkovPredictor,
        )
        from agentcache.predictor.noise import NoisyPredictor
        from agentcache.predictor.static import StaticGraphPredictor

        if self.kind in ("markov", "markov-n"):
            return MarkovPredictor(
                order=self.order,
                horizon=horizon,
                refresh_every=SERVING_REFRESH_EVERY,
                refresh_share=SERVING_REFRESH_SHARE,
            )
        if self.kind == "oracle":
            if trace is None:
                raise ValueError("the oracle forecaster reads each workflow's future from a trace: replay only")
            from agentcache.predictor.oracle import OraclePredictor

            # What new workflows call is no workflow's future: pbkv's own online forecaster answers that.
            arrivals = PredictorSpec("markov-n", order=DEFAULT_ORDER).build(horizon=horizon)
            return OraclePredictor(trace, arrivals, horizon)
        if self.kind == "static":
            if not call_graph:
                raise ValueError("the static predictor needs a call graph (a trace's meta call_graph, or --call-graph)")
            return StaticGraphPredictor(call_graph, horizon, source=call_graph_source)
        if self.kind == "neural":
            try:
                from agentcache.predictor.neural import NeuralPredictor
            except ImportError:
                raise ValueError("the neural predictor needs torch: pip install 'agentcache[predictor]'") from None
            return NeuralPredictor.load(self.path)
        assert self.inner is not None
        return NoisyPredictor(
            self.inner.build(call_graph, horizon=horizon, call_graph_source=call_graph_source, trace=trace), self.noise
        )
