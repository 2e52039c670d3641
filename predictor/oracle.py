"""Perfect forecasts, read from a recorded trace's future: how far better forecasting could take a policy.

A replay serves a trace's requests in order, and a policy reports each request to its forecaster before it
asks for that workflow's forecast (``observe(path, agent)``, then ``predict(path + [agent])``). This
forecaster counts those reports to know which request of the trace is being served, and answers with the
agents that workflow really calls next (END once it has no more requests before its end), one per row, each
with probability 1. What a new workflow will call (``predict([])``) is no workflow's future: that is
answered by pbkv's own online forecaster (Markov over the last DEFAULT_ORDER agents), which learns from every
report, so pbkv differs from its default in the forecasts of workflows under way alone.

Offline only: a server has no future to read. The replay reports as a policy would; a report that does not
match the trace's next request raises an error rather than forecast another workflow's future.
"""

from __future__ import annotations

from collections.abc import Sequence

from agentcache.predictor.base import DEFAULT_HORIZON, END, Forecast, Predictor
from agentcache.trace import End, Request, Trace


class OraclePredictor(Predictor):
    name = "oracle"
    offline = True  # GuardedPredictor lets its errors through: a replay must not go on with wrong forecasts

    def __init__(self, trace: Trace, inner: Predictor, horizon: int = DEFAULT_HORIZON):
        super().__init__(horizon)
        self.inner = inner  # forecasts what new workflows call, and learns as the policy reports
        self.source = f"the future of trace {trace.meta.name or '(unnamed)'}"
        self._requests = [(r.agent, r.workflow) for r in trace.requests]
        self._rows = self._futures(trace)
        self._served = 0  # trace requests reported so far

    def _futures(self, trace: Trace) -> list[Forecast]:
        """Per request of the trace: its workflow's next `horizon` agents as rows (END-padded), rows shared
        by equal futures (callers keep what they derive per rows object)."""
        open_requests: dict[str, list[int]] = {}  # workflow -> its requests since it started
        futures: list[tuple[str, ...]] = []
        for event in trace.events:
            if isinstance(event, End):
                open_requests.pop(event.workflow, None)
            if not isinstance(event, Request):  # ends, and events between requests (tools)
                continue
            earlier = open_requests.setdefault(event.workflow, [])
            for i in earlier[-self.horizon :]:  # the requests this one is within the horizon of
                futures[i] += (event.agent,)
            earlier.append(len(futures))
            futures.append(())
        shared: dict[tuple[str, ...], Forecast] = {}
        rows = []
        for future in futures:
            padded = (*future, *(END,) * (self.horizon - len(future)))
            if padded not in shared:
                shared[padded] = [{agent: 1.0} for agent in padded]
            rows.append(shared[padded])
        return rows

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        self.inner.observe(path, next_agent)
        if next_agent == END:
            return
        served = self._served
        if served >= len(self._requests) or self._requests[served][0] != next_agent:
            expected = (
                f"request {served} of the trace (counting requests) comes from {self._requests[served][0]!r} of "
                f"workflow {self._requests[served][1]!r}"
                if served < len(self._requests)
                else f"the trace has only {len(self._requests)} requests"
            )
            raise ValueError(
                f"the oracle forecaster was told of a request by {next_agent!r}, but {expected}: it forecasts "
                "only a replay of its own trace, in order"
            )
        self._served += 1

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        if not path:
            return self.inner.predict(path, hidden)
        if not self._served:
            raise ValueError("the oracle forecaster was asked about a workflow before any request was reported")
        return self._rows[self._served - 1]
