"""A bench run's figures, and their medians (with min and max) over repetitions run in alternating order."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from agentcache.bench.workload import Sent
from agentcache.replay.results import quantile

# The figures of the calls that follow a tool and of whole workflows, per run (None where a run had none) and
# per policy (their medians over repetitions, with min and max).
TOOL_FIGURES = (
    "post_tool_ttft_p50_s",
    "post_tool_ttft_p90_s",
    "workflow_completion_p50_s",
    "workflow_completion_p90_s",
)


@dataclass
class Run:
    policy: str
    repetition: int
    sent: list[Sent]
    makespan_s: float
    errors: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens for s in self.sent)

    @property
    def computed_prompt_tokens(self) -> int:
        return sum(s.prompt_tokens - s.cached_tokens for s in self.sent)

    @property
    def hit_rate(self) -> float:
        prompt = self.prompt_tokens
        return sum(s.cached_tokens for s in self.sent) / prompt if prompt else 0.0

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.ttft_s for s in self.sent) if self.sent else 0.0

    @property
    def latency_s(self) -> float:
        return statistics.median(s.latency_s for s in self.sent) if self.sent else 0.0

    @property
    def mean_latency_s(self) -> float:
        return statistics.fmean(s.latency_s for s in self.sent) if self.sent else 0.0

    @property
    def p90_latency_s(self) -> float:
        return quantile(sorted(s.latency_s for s in self.sent), 0.9)

    @property
    def post_tool_requests(self) -> int:
        return sum(s.after_tool for s in self.sent)

    @property
    def post_tool_ttft_p50_s(self) -> float | None:
        return self._post_tool_ttft(0.5)

    @property
    def post_tool_ttft_p90_s(self) -> float | None:
        return self._post_tool_ttft(0.9)

    @property
    def workflow_completion_p50_s(self) -> float | None:
        return self._workflow_completion(0.5)

    @property
    def workflow_completion_p90_s(self) -> float | None:
        return self._workflow_completion(0.9)

    def _post_tool_ttft(self, q: float) -> float | None:
        """The q-quantile of the time to first token of the calls that follow a tool (each agent's first after
        its tool ended, the one that reads back what the pause left idle); None where none did."""
        ttft = sorted(s.ttft_s for s in self.sent if s.after_tool)
        return quantile(ttft, q) if ttft else None

    def _workflow_completion(self, q: float) -> float | None:
        """The q-quantile over workflows of first request sent to last answer; None where the run did not say
        which workflow each request was (the demo's)."""
        first: dict[str, float] = {}
        last: dict[str, float] = {}
        for s in self.sent:
            if s.workflow is not None:
                first[s.workflow] = min(first.get(s.workflow, s.sent_s), s.sent_s)
                last[s.workflow] = max(last.get(s.workflow, 0.0), s.sent_s + s.latency_s)
        spans = sorted(last[w] - first[w] for w in first)
        return quantile(spans, q) if spans else None

    def to_json(self) -> dict[str, Any]:
        return {
            "repetition": self.repetition,
            "requests": len(self.sent),
            "hit_rate": self.hit_rate,
            "computed_prompt_tokens": self.computed_prompt_tokens,
            "ttft_s": self.ttft_s,
            "latency_s": self.latency_s,
            "mean_latency_s": self.mean_latency_s,
            "p90_latency_s": self.p90_latency_s,
            "makespan_s": self.makespan_s,
            "prompt_tokens": self.prompt_tokens,
            "post_tool_requests": self.post_tool_requests,
            **{name: getattr(self, name) for name in TOOL_FIGURES},
        }


def run_order(policies: Sequence[str], repeat: int) -> list[tuple[int, str]]:
    """(repetition, policy) in the order they run: forward, backward, forward, ..."""
    order = []
    for r in range(repeat):
        for policy in policies if r % 2 == 0 else reversed(policies):
            order.append((r, policy))
    return order


def spread(values: Iterable[float]) -> dict[str, float]:
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def spread_of_some(values: Iterable[float | None]) -> dict[str, float] | None:
    """`spread` of the values given, those that are None aside; None where all are."""
    given = [v for v in values if v is not None]
    return spread(given) if given else None


def summarize(runs: Sequence[Run]) -> dict[str, dict[str, Any]]:
    """The JSON contract: per policy, medians (with min and max) over its repetitions."""
    out: dict[str, dict[str, Any]] = {}
    for policy in dict.fromkeys(r.policy for r in runs):
        mine = sorted((r for r in runs if r.policy == policy), key=lambda r: r.repetition)
        out[policy] = {
            "hit_rate": statistics.median(r.hit_rate for r in mine),
            "computed_prompt_tokens": statistics.median(r.computed_prompt_tokens for r in mine),
            "runs": len(mine),
            "requests": len(mine[0].sent),
            "ttft_s": spread(r.ttft_s for r in mine),
            "latency_s": spread(r.latency_s for r in mine),
            "makespan_s": spread(r.makespan_s for r in mine),
            **{name: spread_of_some(getattr(r, name) for r in mine) for name in TOOL_FIGURES},
            "repetitions": [r.to_json() for r in mine],
        }
    return out


def paired_ratios(runs: Sequence[Run], policy: str, baseline: str, metric: str) -> list[float]:
    """`policy`'s metric over `baseline`'s, per repetition (runs of one repetition ran next to each other)."""
    by = {(r.policy, r.repetition): getattr(r, metric) for r in runs}
    reps = sorted({r.repetition for r in runs})
    return [by[(policy, i)] / by[(baseline, i)] for i in reps if by.get((baseline, i))]
