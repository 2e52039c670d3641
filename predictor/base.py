"""The predictor interface: a workflow's state in, K distributions over agents plus END out.

Row k of a forecast is the *unconditional* distribution of the workflow's
k-th next request: END is absorbing, so its mass never shrinks from one row to
the next, and PBKV's survival-weighted ``s_w^(k) P_w^(k)(a)`` is simply row k's
probability of `a`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Sequence
from typing import Any, ClassVar, Generic, TypeVar

from mypy_extensions import mypyc_attr

END = "<END>"  # the workflow finished: absorbing
START = "<START>"  # marks the beginning of a workflow's path in contexts; never predicted
# K, the next calls of a workflow a forecast names. A pipeline reads a stage's cache again four calls later: with
# K = 3 only the forecast's smoothing mass valued it (perfect 3-step forecasts made pbkv worse there). On
# development seeds 4 raised pbkv's hit rate on the pipeline by 1.4-2.7 points at 8x and 16x and moved the other
# families by -0.75 to +0.76 (means -0.07 to +0.11); 6 did no better on the pipeline and worse elsewhere
# (docs/design/policy.md, "How far ahead").
DEFAULT_HORIZON = 4

Forecast = list[dict[str, float]]  # K rows; each maps agent (or END) -> probability, summing to 1


logger = logging.getLogger("agentcache")


# Compiled with mypyc (agentcache.compiled), subclassed by the predictors that are not. Compiled code reads an
# attribute from this class's slot, blind to a value a subclass's class body gives it, unless it is a ClassVar:
# `learns_online` and `offline` are; `name`, which some set per instance, compiled code reads with getattr.
@mypyc_attr(allow_interpreted_subclasses=True)
class Predictor(ABC):
    """Forecasts a workflow's next `horizon` agents from the agents it called so far.

    Agents are the names users know (framework node, agent or role names) where the SDK sends one,
    else prompt fingerprints: the same identity the recorder writes and call graphs use.
    """

    name: str = "predictor"
    source: str = ""  # where its knowledge comes from, for messages: "the call graph g.json", "the model m.pt"
    learns_online: ClassVar[bool] = True  # False: it knows a fixed set of agents (a call graph, a trained model)
    # True: it reads a recorded trace's future (replay only); its faults are bugs to show
    offline: ClassVar[bool] = False

    def __init__(self, horizon: int = 3):
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        self.horizon = horizon

    @abstractmethod
    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        """K rows for a workflow whose requests so far came from the agents in `path` (oldest first).

        The rows are not changed once returned: callers keep them, and may return the same rows again
        for another workflow at the same point (GuardedPredictor checks each rows object once)."""

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        """Learn online that a workflow at `path` went on to `next_agent` (END when it finished)."""

    def knows(self, agent: str) -> bool:
        """Whether `agent` is one this predictor has knowledge of (seen, declared, or trained on)."""
        return True

    def known_agents(self) -> Collection[str]:
        return ()


Derived = TypeVar("Derived")


class PerForecast(Generic[Derived]):
    """What was derived from each forecast, kept while that forecast is the same object: predictors return the
    rows they keep per context to every workflow at that point (and never change them), so what is derived
    from a forecast is derived once. Holds the forecasts themselves, so an id stays its object's; cleared when
    `limit` are held."""

    def __init__(self, limit: int):
        self.limit = limit
        self._held: dict[int, tuple[Forecast, Derived]] = {}

    def get(self, rows: Forecast) -> Derived | None:
        held = self._held.get(id(rows))
        return held[1] if held is not None and held[0] is rows else None

    def put(self, rows: Forecast, derived: Derived) -> None:
        if len(self._held) >= self.limit:
            self._held.clear()
        self._held[id(rows)] = (rows, derived)


class AgentCoverage:
    """Proof that a forecaster is engaged: forecasts made, and whether it knew the agent each started from.

    A forecaster with a fixed set of agents (a call graph, a trained model) that meets an agent it does
    not know says so loudly, once per agent: a graph or model written for other names than the live
    agents' would otherwise just forecast nothing useful, silently.
    """

    MAX_NAMES = 16  # unknown agents named in the statistics and the log

    def __init__(self, forecaster: str, source: str = "", on_count: Callable[[str, str], None] | None = None):
        self.forecaster, self.source = forecaster, source
        self.known = self.unknown = self.new_workflow = 0
        self.unknown_agents: list[str] = []
        self.on_count = on_count  # (forecaster, "known" | "unknown" | "new_workflow"), e.g. for metrics

    def count(self, predictor: Predictor | Any, agent: str | None) -> None:
        """One forecast from `agent` (None: for a workflow not started yet) by `predictor`, or anything with
        its `knows`, `known_agents`, `learns_online` and `source` (KVFlow's step graph)."""
        if agent is None:
            self.new_workflow += 1
            outcome = "new_workflow"
        elif predictor.knows(agent):
            self.known += 1
            outcome = "known"
        else:
            self.unknown += 1
            outcome = "unknown"
            if agent not in self.unknown_agents and len(self.unknown_agents) < self.MAX_NAMES:
                self.unknown_agents.append(agent)
                if not predictor.learns_online:
                    known = sorted(predictor.known_agents())
                    logger.warning(
                        "agentcache: %s does not know the live agent %r: forecasts from it are uninformed. It knows"
                        " %d agents: %s. Agents are the names the SDK sends (LangGraph nodes, AutoGen agents, CrewAI"
                        " roles), else prompt fingerprints (a:...), as in a recorded trace",
                        self.source or self.forecaster,
                        agent,
                        len(known),
                        ", ".join(known[:20]) + (", ..." if len(known) > 20 else ""),
                    )
        if self.on_count is not None:
            self.on_count(self.forecaster, outcome)

    @property
    def forecasts(self) -> int:
        return self.known + self.unknown + self.new_workflow

    def to_json(self) -> dict[str, Any]:
        """`known_agent` / `unknown_agent`: forecasts from an agent it knew / did not know; `new_workflow`:
        forecasts for workflows not started yet (arrivals)."""
        return {
            "source": self.source,
            "forecasts": self.forecasts,
            "known_agent": self.known,
            "unknown_agent": self.unknown,
            "new_workflow": self.new_workflow,
            "unknown_agents": list(self.unknown_agents),
        }
