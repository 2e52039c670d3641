"""Online order-N Markov predictor over agent transitions (CacheScout's learner, generalised).

Counts ``C[context][next]`` with context = the last N agents, a workflow's
path starting with a START marker so that its first agent is learned too
(``predict([])`` forecasts what a new workflow calls). The next-agent
distribution backs off from the longest context seen to shorter ones and, for
an unseen agent, to the global distribution of next agents, each mixed with
additive smoothing so no outcome that has ever been seen gets probability 0.
K-step rows come from rolling the chain forward over contexts, END absorbing.

Its state is bounded, since agent ids come from clients: it keeps the
`max_agents` most recently observed agents and the `max_contexts` most recently
observed contexts, forgetting the oldest beyond that, and a rollout follows at
most MAX_STATES contexts per step. Rows are dense over the kept agents, so these
caps bound the work of one forecast too.

A forecast depends only on the context (the last N agents) and the counts, so
forecasts are kept per context and recomputed once `refresh_every` transitions
have been learned since (1: after every one), or once a new agent or outcome
appears: many workflows share few contexts, and on a busy server the counts
of one more transition barely move a forecast. With `refresh_share`, the wait
grows with what was learned (at least 1/refresh_share of all transitions so
far): a transition moves a forecast by about one over the transitions behind
it, so a long-running server re-rolls its contexts ever more rarely. A
forecaster built from a spec (``markov``, ``markov-n:N``) re-rolls at
SERVING_REFRESH_EVERY and SERVING_REFRESH_SHARE, as pbkv's own does.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Sequence

from agentcache.predictor.base import DEFAULT_HORIZON, END, START, Forecast, Predictor

# How many of a workflow's last agents pbkv's default forecaster conditions on. Loops that stop after a few rounds
# and pipelines that call one agent at several stages are told apart only by more than the last three (the
# back-off keeps shorter contexts wherever the longer ones have too little data). On development seeds, 6
# raised pbkv's mean hit rate over 3 on every generated family but plain chat (unchanged) and group chat
# (-0.05 points), where 8 did no better (docs/results/archive/forecaster-order.md).
DEFAULT_ORDER = 6
# What a forecaster that serves a policy re-rolls at: every SERVING_REFRESH_EVERY transitions, or once it learned
# 1/SERVING_REFRESH_SHARE more than it knew where that is more (counts of a few more transitions move a forecast
# by their share). Re-rolling every context of an order-6 forecaster after every transition was pbkv's largest
# cost per request on a busy server.
SERVING_REFRESH_EVERY = 16
SERVING_REFRESH_SHARE = 16


class MarkovPredictor(Predictor):
    PRUNE = 1e-3  # rollout contexts below this mass merge into their order-1 suffix
    MAX_STATES = 16  # rollout contexts kept per step; the rest's mass backs off to the global prior

    def __init__(
        self,
        order: int = 1,
        horizon: int = DEFAULT_HORIZON,
        smoothing: float = 0.5,
        max_agents: int = 64,
        max_contexts: int = 4096,
        refresh_every: int = 1,
        refresh_share: int | None = None,
    ):
        super().__init__(horizon)
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        if max_agents < 1 or max_contexts < 1:
            raise ValueError(f"max_agents and max_contexts must be >= 1, got {max_agents} and {max_contexts}")
        if refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {refresh_every}")
        if refresh_share is not None and refresh_share < 1:
            raise ValueError(f"refresh_share must be >= 1, got {refresh_share}")
        self.refresh_every = refresh_every
        self.refresh_share = refresh_share
        self._since_refresh = 0
        self._learned = 0  # transitions counted, forgotten ones included
        self._forecasts: dict[tuple[str, ...], Forecast] = {}  # context -> rows, until the next refresh
        self.order = order
        self.smoothing = smoothing
        self.max_agents = max_agents
        self.max_contexts = max_contexts
        self.name = "markov" if order == 1 else f"markov-{order}"
        # counts[context tuple] -> {next: count}; contexts of every length 1..order, and () for the global
        # prior; least recently observed first
        self.counts: OrderedDict[tuple[str, ...], dict[str, float]] = OrderedDict()
        # the agents kept, in first-seen order: rows iterate it, so their order (and sums) are the same in
        # every process that saw the same transitions; END is always kept
        self.outcomes: dict[str, None] = {END: None}
        self._agents_by_recency: OrderedDict[str, None] = OrderedDict()  # least recently observed first
        self._row_cache: dict[tuple[str, ...], dict[str, float]] = {}
        # _backed_off's rows of every suffix, while the counts are the ones they were computed from
        self._suffix_rows: dict[tuple[str, ...], dict[str, float]] = {}
        self._suffixes_learned = -1
        self._successor_cache: dict[tuple[str, ...], list[tuple[str, float, tuple[str, ...] | None]]] = {}

    def _context(self, path: Sequence[str]) -> tuple[str, ...]:
        return ((START,) + tuple(path[-self.order :]))[-self.order :]

    def observe(self, path: Sequence[str], next_agent: str) -> None:
        if not path and next_agent == END:
            return  # a workflow that never called anything teaches nothing
        new_outcome = next_agent not in self.outcomes
        self.outcomes[next_agent] = None
        if next_agent != END:
            self._agents_by_recency[next_agent] = None
            self._agents_by_recency.move_to_end(next_agent)
        context = self._context(path)
        counts = self.counts
        for start in range(len(context), -1, -1):  # (), then ever longer suffixes up to the whole context
            key = context[start:]
            row = counts.get(key)
            if row is None:
                row = counts[key] = defaultdict(float)
            counts.move_to_end(key)
            row[next_agent] += 1.0
        if len(self._agents_by_recency) > self.max_agents or len(counts) > self.max_contexts:
            self._forget_beyond_caps()
        self._learned += 1
        self._since_refresh += 1
        wait = self.refresh_every
        if self.refresh_share is not None:
            wait = max(wait, self._learned // self.refresh_share)
        if new_outcome or self._since_refresh >= wait:
            self._since_refresh = 0
            self._row_cache.clear()
            self._successor_cache.clear()
            self._forecasts.clear()

    def _forget_beyond_caps(self) -> None:
        while len(self._agents_by_recency) > self.max_agents:
            oldest, _ = self._agents_by_recency.popitem(last=False)
            del self.outcomes[oldest]
            for key in [k for k in self.counts if oldest in k]:
                del self.counts[key]
            for row in self.counts.values():
                row.pop(oldest, None)
        while len(self.counts) > self.max_contexts:
            oldest_key = next(k for k in self.counts if k)  # the global prior () is never forgotten
            del self.counts[oldest_key]

    def knows(self, agent: str) -> bool:
        return agent in self.outcomes

    def known_agents(self) -> list[str]:
        return [a for a in self.outcomes if a != END]

    def next_distribution(self, context: Sequence[str]) -> dict[str, float]:
        """P(next | context), backing off from the longest seen suffix of `context`."""
        key = tuple(context)
        cached = self._row_cache.get(key)
        if cached is None:
            cached = self._row_cache[key] = self._backed_off(key)
        return cached

    def _backed_off(self, key: tuple[str, ...]) -> dict[str, float]:
        """Back-off from the counts as they are now: the global prior, refined by each longer suffix of `key`
        that has data. The rows of the suffixes are shared by the contexts computed before anything more is
        learned (a re-roll computes many that share suffixes)."""
        if self._suffixes_learned != self._learned:
            self._suffix_rows.clear()
            self._suffixes_learned = self._learned
        dist = self._suffix_rows.get(key)
        if dist is None:
            if key:
                dist = self._backed_off(key[1:])
                counts = self.counts.get(key)
                if counts:
                    dist = self._smoothed(counts, dist)
            else:
                dist = self._smoothed(self.counts.get((), {}), None)
            self._suffix_rows[key] = dist
        return dist

    def _successors(self, context: tuple[str, ...]) -> list[tuple[str, float, tuple[str, ...] | None]]:
        """(agent, P(agent | context), the context after it; None after END), kept until the next refresh."""
        successors = self._successor_cache.get(context)
        if successors is None:
            order = self.order
            successors = self._successor_cache[context] = [
                (agent, q, None if agent == END else (context + (agent,))[-order:])
                for agent, q in self.next_distribution(context).items()
            ]
        return successors

    def _smoothed(self, counts: dict[str, float], prior: dict[str, float] | None) -> dict[str, float]:
        outcomes = self.outcomes
        total = sum(counts.values())
        alpha = self.smoothing * len(outcomes)
        if prior is None:
            prior = {o: 1.0 / len(outcomes) for o in outcomes}
        denom = total + alpha
        count = counts.get
        # A prior is a row over the same outcomes (rows are rebuilt whenever an outcome comes or goes).
        return {o: (count(o, 0.0) + alpha * p) / denom for o, p in prior.items()}

    def predict(self, path: Sequence[str], hidden: Sequence[float] | None = None) -> Forecast:
        context = self._context(path)
        rows = self._forecasts.get(context)
        if rows is None:
            rows = self._forecasts[context] = self._roll(context)
        return rows

    def _roll(self, context: tuple[str, ...]) -> Forecast:
        # Roll the chain forward over contexts (the last N agents), END absorbing. Contexts
        # holding less than PRUNE of the mass merge into their order-1 suffix, which keeps
        # every row summing to one while bounding the work per step.
        states: dict[tuple[str, ...], float] = {context: 1.0}
        ended = 0.0
        rows: Forecast = []
        for step in range(self.horizon):
            last = step == self.horizon - 1  # where the chain goes after the last row is never read
            row: dict[str, float] = {END: ended}
            nxt: dict[tuple[str, ...], float] = {}
            for context, p in states.items():
                for agent, q, successor in self._successors(context):
                    pq = p * q
                    row[agent] = row.get(agent, 0.0) + pq
                    if last:
                        continue
                    if successor is None:
                        ended += pq
                    else:
                        nxt[successor] = nxt.get(successor, 0.0) + pq
            rows.append(row)
            if last:
                break
            states = {}
            for context, p in nxt.items():
                key = context if p >= self.PRUNE or len(context) == 1 else context[-1:]
                states[key] = states.get(key, 0.0) + p
            if len(states) > self.MAX_STATES:
                ranked = sorted(states.items(), key=lambda kv: kv[1], reverse=True)
                states = dict(ranked[: self.MAX_STATES])
                states[()] = states.get((), 0.0) + sum(p for _, p in ranked[self.MAX_STATES :])
        return rows
