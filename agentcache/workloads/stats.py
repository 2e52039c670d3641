"""Measures of how a trace's prompts reuse one another, to check generators against recorded apps.

Two numbers tell appending apps from rebuilding ones: how often an agent's next
call in a workflow extends its previous prompt + output (the continuation
rate), and where the tokens an unbounded prefix cache could reuse lie: in the
agents' fixed prompts or in the context after them.
"""

from __future__ import annotations

from typing import NamedTuple

from agentcache.trace import Request, Segment, Trace


def continuation_rate(trace: Trace) -> float | None:
    """Share of repeat calls (an agent called again in the same workflow) whose prompt starts with that agent's
    previous prompt + output; None when no agent calls twice in a workflow."""
    previous: dict[tuple[str, str], Request] = {}
    repeats = continued = 0
    for r in trace.requests:
        key = (r.workflow, r.agent)
        prev = previous.get(key)
        previous[key] = r
        if prev is None:
            continue
        repeats += 1
        if prev.output_id is not None:
            extended = (*prev.segments, Segment(prev.output_id, prev.output))
            continued += r.segments[: len(extended)] == extended
    return continued / repeats if repeats else None


class ReuseShares(NamedTuple):
    """Prompt tokens by what an unbounded prefix cache holds for them when they arrive."""

    prompt_tokens: int
    fixed_reused: int  # in the agent's fixed prompt, after an identical prefix seen before
    context_reused: int  # after the fixed prompt, after an identical prefix seen before

    @property
    def reused(self) -> int:
        return self.fixed_reused + self.context_reused

    @property
    def fixed_share(self) -> float:
        """Share of the reusable tokens that are fixed prompts."""
        return self.fixed_reused / self.reused if self.reused else 0.0

    @property
    def fresh_share(self) -> float:
        """Share of the prompt tokens no earlier prompt or named output could have supplied."""
        return 1.0 - self.reused / self.prompt_tokens if self.prompt_tokens else 0.0


def reuse_shares(trace: Trace) -> ReuseShares:
    """Split the trace's prompt tokens as a radix cache that never evicts would serve them.

    A segment is reusable when every segment up to and including it repeats an earlier prompt (or an
    earlier prompt followed by its named output), as a radix tree only reuses shared prefixes.
    """
    chains: dict[tuple[int, str], int] = {}  # (preceding chain, content id) -> chain
    prompt = fixed = context = 0
    for r in trace.requests:
        parent, matching = 0, True
        for i, seg in enumerate(r.segments):
            key = (parent, seg.content_id)
            matching = matching and key in chains
            if matching:
                if i < r.fixed:
                    fixed += seg.tokens
                else:
                    context += seg.tokens
            parent = chains.setdefault(key, len(chains) + 1)
        if r.output_id is not None:
            chains.setdefault((parent, r.output_id), len(chains) + 1)
        prompt += r.prompt_tokens
    return ReuseShares(prompt, fixed, context)
