"""The benchmark suite: which traces, at which capacities. Shared by every benchmark script.

Generated families use fixed knobs and seed, so every number is reproducible;
their capacities are 4x, 8x and 16x the trace's mean prompt (tight, medium,
roomy). The real traces use the capacities their README calls interesting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")

from agentcache.engine.sglang_warnings import ignore_sglang_gpu_only_warnings  # noqa: E402
from agentcache.trace import Trace, read_trace  # noqa: E402
from agentcache.workloads import FAMILIES, GenConfig, generate  # noqa: E402

ignore_sglang_gpu_only_warnings()  # as the CLI does: the pages' progress bars come first

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DOCS = ROOT / "docs"
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
    dynamic: bool  # a generated family whose path is decided at run time
    real: bool


def mean_prompt(trace: Trace) -> float:
    requests = trace.requests
    return sum(r.prompt_tokens for r in requests) / len(requests)


def generated(family: str, seed: int = GENERATED.seed) -> SuiteTrace:
    """A generated family at `seed` (the suite's knobs), with its capacities: CAPACITY_FACTORS x its mean prompt."""
    from agentcache.workloads import DYNAMIC_FAMILIES

    trace = generate(family, replace(GENERATED, seed=seed))
    m = mean_prompt(trace)
    return SuiteTrace(family, trace, tuple(int(m * f) for f in CAPACITY_FACTORS), family in DYNAMIC_FAMILIES, False)


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
        yield SuiteTrace(name, read_trace(REAL_TRACES / f"{name}.jsonl"), capacities, False, True)


def write_between_markers(path: Path, name: str, text: str) -> None:
    """Replace what lies between `<!-- name:begin -->` and `<!-- name:end -->` in `path` (a benchmark's part of
    a page others write too); the markers are added at the end of the page when missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{text.rstrip()}\n{end}"
    page = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(page):
        page = pattern.sub(lambda _: block, page)
    else:
        page = page.rstrip() + ("\n\n" if page else "") + block + "\n"
    path.write_text(page)
