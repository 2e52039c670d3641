"""Static-graph predictor (KVFlow-style): a random walk on the declared call graph.

From the current agent a, the next agent is uniform over a's successors in the
graph, and END when a has none. With `learn_end` (the default) END also comes
with a per-agent hazard learned online, because a cyclic graph never reaches
an agent without successors:

    P(END | a) = ends(a) / (visits(a) + 1),   P(b | a) = (1 - P(END | a)) / |succ(a)|  for b in succ(a)

(zero before any observation: the pure graph). Rows roll this chain forward K
steps with END absorbing. A new workflow starts uniformly at the graph's roots
(agents nothing calls; every agent when each has a caller); an agent the graph
does not know gets a uniform next step over the graph's agents and END.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from agentcache.predictor.base import DEFAULT_HORIZON, END, Forecast, Predictor


class StaticGraphPredictor(Predictor):
    name = "static"
    learns_online = False

    def __init__(
        self,
        call_graph: Mapping[str, Sequence[str]],
        horizon: int = DEFAULT_HORIZON,
        learn_end: bool = True,
        source: str = "the call graph",
    ):
        super().__init__(horizon)
        self.source = source
        self.successors = {a: sorted(set(s)) for a, s in call_graph.items()}
        called = {b for succ in self.successors.values() for b in succ}
        self.agents = sorted(set(self.successors) | called)
        self.known = frozenset(self.agents)
        if not self.agents:
            raise ValueError("the call graph has no agents")
        self.roots = [a for a in self.agents if a not in called] or self.agents
        self.learn_end = learn_end
        self.visits: dict[str, int] = {}  # agent -> observed transitions out of it
        self.ends: dict[str, int] = {}  # agent -> how many of them were END

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        if self.learn_end and path:
            agent = path[-1]
            self.visits[agent] = self.visits.get(agent, 0) + 1
            self.ends[agent] = self.ends.get(agent, 0) + (next_agent == END)

    def knows(self, agent: str) -> bool:
        return agent in self.known

    def known_agents(self) -> frozenset[str]:
        return self.known

    def next_distribution(self, agent: str | None) -> dict[str, float]:
        """P(next | current agent); None is a workflow that has not called anything yet."""
        if agent is None:
            return {a: 1.0 / len(self.roots) for a in self.roots}
        if agent not in self.known:
            outcomes = self.agents + [END]
            return {a: 1.0 / len(outcomes) for a in outcomes}
        successors = self.successors.get(agent)
        if not successors:
            return {END: 1.0}
        end = self.ends.get(agent, 0) / (self.visits.get(agent, 0) + 1)
        dist = {b: (1.0 - end) / len(successors) for b in successors}
        dist[END] = end
        return dist

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        states: dict[str | None, float] = {path[-1] if path else None: 1.0}
        ended = 0.0
        rows: Forecast = []
        for _ in range(self.horizon):
            nxt: dict[str | None, float] = defaultdict(float)
            for agent, p in states.items():
                for b, q in self.next_distribution(agent).items():
                    if b == END:
                        ended += p * q
                    else:
                        nxt[b] += p * q
            states = dict(nxt)
            rows.append({**states, END: ended})
        return rows
