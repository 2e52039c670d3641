"""Turning trace segments into token ids for the radix tree, and reading them back.

The trace format asks for deterministic token ids per content id. A radix tree
only ever compares tokens that follow identical prefixes, so we make each
token id name its place: ``id = chain * 2**OFFSET_BITS + offset``, where
`chain` numbers the distinct (preceding chain, content id) pairs. Two prompts
share exactly the tokens they would share with content-seeded random ids (the
same segments in the same order), no two different segments ever collide, and
any token says which segment-in-context it belongs to, which is what the
offline reference needs to find a node's next use.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from agentcache.trace import Request, Segment

OFFSET_BITS = 20
MAX_SEGMENT_TOKENS = 1 << OFFSET_BITS  # a segment's (or output's) offsets must stay within its chain's ids


def check_encodable(requests: Sequence[Request]) -> None:
    """Raise ValueError naming the first request with a segment or output too long to encode, before any token
    is made (an output of 10^11 tokens ended a replay in MemoryError)."""
    for index, request in enumerate(requests):
        _check_lengths(request, index)


def _check_lengths(request: Request, index: int) -> None:
    for seg in request.segments:
        if seg.tokens >= MAX_SEGMENT_TOKENS:
            raise ValueError(
                f"request {index}: segment {seg.content_id!r} has {seg.tokens:,} tokens; the replay encodes at most"
                f" {MAX_SEGMENT_TOKENS - 1:,} per segment"
            )
    if request.output >= MAX_SEGMENT_TOKENS:
        raise ValueError(
            f"request {index}: its output has {request.output:,} tokens; the replay encodes at most"
            f" {MAX_SEGMENT_TOKENS - 1:,}"
        )


class EncodedRequest(NamedTuple):
    tokens: array  # prompt then output, as SGLang's requests hold them ("q": int64)
    prompt_len: int
    fixed_len: int
    prompt_chains: tuple[int, ...]  # chain ids of the prompt's segments


class TokenCodec:
    def __init__(self) -> None:
        self._chains: dict[tuple[int, str], int] = {}

    def _chain(self, parent: int, content_id: str) -> int:
        key = (parent, content_id)
        chain = self._chains.get(key)
        if chain is None:
            chain = self._chains[key] = len(self._chains) + 1
        return chain

    def encode(self, request: Request, index: int) -> EncodedRequest:
        tokens = array("q")
        chains: list[int] = []
        parent = 0
        fixed_len = 0
        segments: Sequence[Segment] = request.segments
        _check_lengths(request, index)
        for i, seg in enumerate(segments):
            parent = self._chain(parent, seg.content_id)
            chains.append(parent)
            base = parent << OFFSET_BITS
            tokens.extend(range(base, base + seg.tokens))
            if i + 1 == request.fixed:
                fixed_len = len(tokens)
        prompt_len = len(tokens)
        # Generated tokens are unique unless the trace names them (output_id), as a real engine's would be.
        output_id = request.output_id if request.output_id is not None else f"\0unique-output-{index}"
        base = self._chain(parent, output_id) << OFFSET_BITS
        tokens.extend(range(base, base + request.output))
        return EncodedRequest(tokens, prompt_len, fixed_len, tuple(chains))


class NextUseIndex:
    """For each chain, the sorted indices of the requests whose prompt reads it."""

    def __init__(self, encoded: Sequence[EncodedRequest]):
        uses: dict[int, list[int]] = {}
        for index, enc in enumerate(encoded):
            for chain in enc.prompt_chains:
                uses.setdefault(chain, []).append(index)
        self._uses = uses

    def next_use(self, first_token: int, after: int) -> float:
        """Index of the first request after `after` that reads the segment of `first_token` (inf if none)."""
        uses = self._uses.get(first_token >> OFFSET_BITS)
        if not uses:
            return float("inf")
        i = bisect_right(uses, after)
        return uses[i] if i < len(uses) else float("inf")
