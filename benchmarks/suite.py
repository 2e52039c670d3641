"""The benchmark suite: which traces, at which capacities. Shared by the page writers that replay it.

Generated families use fixed knobs and seed, so every number is reproducible;
their capacities are 4x, 8x and 16x the trace's mean prompt (tight, medium,
roomy). The real traces use the capacities their README calls interesting.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from agentcache.trace import Trace, read_trace
from agentcache.workloads import FAMILIES, GenConfig, generate

HERE = Path(__file__).resolve().parent
REAL_TRACES = HERE / "traces"

GENERATED = GenConfig(workflows=150, seed=1)
CAPACITY_FACTORS = (4, 8, 16)
REAL_CAPACITIES = {
    "cachescout_gsm8k": (3600, 7000, 14000),
    "swesmith_swe_agent": (14000, 21000, 35000),
}


@dataclass
class SuiteTrace:
    name: str
    trace: Trace
    capacities: tuple[int, ...]
    real: bool  # a recorded trace (else a generated family)


def mean_prompt(trace: Trace) -> float:
    requests = trace.requests
    return sum(r.prompt_tokens for r in requests) / len(requests)


def generated(family: str, seed: int = GENERATED.seed) -> SuiteTrace:
    """A generated family at `seed` (the suite's knobs), with its capacities: CAPACITY_FACTORS x its mean prompt."""
    trace = generate(family, replace(GENERATED, seed=seed))
    m = mean_prompt(trace)
    return SuiteTrace(family, trace, tuple(int(m * f) for f in CAPACITY_FACTORS), False)


def suite(only: list[str] | None = None, seed: int | None = None) -> Iterator[SuiteTrace]:
    """The suite's traces; with `seed`, the generated families at that seed alone (a recorded trace has none)."""
    for family in FAMILIES:
        if only and family not in only:
            continue
        yield generated(family, GENERATED.seed if seed is None else seed)
    if seed is not None:
        return
    for name, capacities in REAL_CAPACITIES.items():
        if only and name not in only:
            continue
        yield SuiteTrace(name, read_trace(REAL_TRACES / f"{name}.jsonl"), capacities, True)
