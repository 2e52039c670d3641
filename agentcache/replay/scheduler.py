"""One modelled SGLang worker in the timed replay: its cache, and its scheduler's queue, batches and clock.

The untimed replay (runner.py) serves each request alone, the moment it
arrives. A server is busier than that: requests queue, batches run, and while
a request runs its prefix is held and its slots are taken, so the cache has
less room than its capacity. This model runs the same cache code
(:class:`ReplayCache`: SGLang's real radix cache with the policy, through the
engine layer the plugin also uses) under a model of SGLang 0.5.23's scheduler:

- a request arrives at its trace time (scaled by `time_scale`), and never
  before the previous request of its workflow finished: a client waits for
  the answer before its next call;
- each worker's waiting queue is admitted first come, first served, into
  prefill batches of at most `prefill_budget` tokens computed (a cached
  prefix is not counted; a longer prompt is prefilled alone, where SGLang
  would chunk it), as long as the KV pool can hold the request (free and
  evictable slots, counted as SGLang counts them: with the request's cached
  prefix pinned, ``ReplayCache.admissible``); a request that does not fit
  waits at the head of the queue, and only one larger than the whole cache
  is refused. The output is counted whole for the request admitted, and for
  the running requests as SGLang counts it: a share of what each may still
  write (``new_token_ratio``: 0.7, falling to 0.098 over 600 decode steps;
  a request's max_new_tokens is taken to be its output length, as
  ``agentcache bench`` sends it);
  admission holds the matched prefix and allocates the rest of the prompt,
  evicting by the policy (``ReplayCache.admit``);
- a decode step allocates one slot per running request, evicting by the
  policy; where the free and evictable slots are too few, the requests that
  generated least are retracted (their output freed, back to the queue, to
  be prefilled again with what they wrote; its hits are those of its first
  prefill) until the rest fit, and the share is re-estimated, as SGLang's
  ``retract_decode`` does;
- a step is a prefill batch when one can be formed, else one decode step of
  every running request; its duration comes from the cost model
  (``CostModel.prefill_batch_s``, ``CostModel.decode_step_s``); a prefill
  batch's requests emit their first token at its end (time to first token),
  and their prompts enter the tree, shareable from then on
  (``ReplayCache.checkpoint``, SGLang's ``cache_unfinished_req``);
- a request that has produced its output finishes: prompt and output enter
  the tree, the prefix is released, and the policy tags the path
  (``ReplayCache.finish``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from agentcache.cost import CostModel
from agentcache.replay.engine import Admission, ReplayCache
from agentcache.replay.tokens import EncodedRequest
from agentcache.tags import Tags

DEFAULT_PREFILL_BUDGET = 8192  # SGLang's chunked-prefill size for an 8B model on one H100
# SGLang 0.5.23's defaults (environ.py, NewTokenRatioTracker): an admission counts this share of what each running
# request may still write, a share that falls to its 0.14th over 600 decode steps, is re-estimated when decode runs
# out of slots, and starts again when the worker goes idle.
NEW_TOKEN_RATIO = 0.7
MIN_NEW_TOKEN_RATIO = NEW_TOKEN_RATIO * 0.14
NEW_TOKEN_RATIO_DECAY = (NEW_TOKEN_RATIO - MIN_NEW_TOKEN_RATIO) / 600
RETRACT_DECODE_STEPS = 20  # decode steps' slots freed per remaining request when requests are retracted


@dataclass
class Served:
    """One request's life on a worker."""

    index: int  # the request's place in the trace
    workflow: str
    worker: int
    arrival: float
    prompt_tokens: int
    output_tokens: int
    hit_tokens: int = 0
    loaded_tokens: int = 0
    admitted_at: float = math.nan  # start of its prefill batch: it waited in the queue until then
    first_token: float = math.nan
    finished: float = math.nan
    admitted: bool = True
    retracted: int = 0  # times decode ran out of slots and put it back in the queue (re-prefilled later)

    @property
    def ttft_s(self) -> float:
        return self.first_token - self.arrival

    @property
    def latency_s(self) -> float:
        return self.finished - self.arrival


@dataclass
class _Running:
    served: Served
    admission: Admission
    context: int  # tokens of KV the request reads per decode step
    left: int  # output tokens still to generate
    output_slots: list[int] = field(default_factory=list)  # allocated a decode step at a time

    @property
    def generated(self) -> int:
        """Output tokens written so far."""
        return self.served.output_tokens - self.left


class _Waiting(NamedTuple):
    served: Served
    enc: EncodedRequest  # a retracted request's prompt includes what it generated before (it is re-prefilled)
    tags: Tags
    left: int  # output tokens still to generate


class Worker:
    """One SGLang worker: its cache (with the policy) and its scheduler's queue, running batch and clock."""

    def __init__(
        self, index: int, cache: ReplayCache, cost: CostModel, prefill_budget: int, max_running: int | None = None
    ):
        self.index = index
        self.cache = cache
        self.cost = cost
        self.prefill_budget = prefill_budget
        self.max_running = max_running  # requests a batch may hold at once (SGLang's max_running_requests)
        self.waiting: deque[_Waiting] = deque()
        self.new_token_ratio = NEW_TOKEN_RATIO
        self.running: list[_Running] = []
        self.busy_until = 0.0  # end of the step in progress
        self.busy_s = 0.0  # time spent in steps so far
        self.served: list[Served] = []
        self._refused: list[Served] = []
        # The queue's head when it did not fit: it cannot fit before a request finishes or is retracted, or a
        # prefill batch checkpoints (which frees the slots of prompts another request cached first), so it is not
        # re-checked (decode steps only take slots).
        self._blocked: Served | None = None

    @property
    def policy(self) -> Any:
        return self.cache.policy

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def enqueue(self, served: Served, enc: EncodedRequest, tags: Tags) -> None:
        self.waiting.append(_Waiting(served, enc, tags, served.output_tokens))
        self.served.append(served)

    def step(self, now: float) -> list[Served]:
        """Run one scheduler step starting at `now`; the requests it finished. Sets `busy_until`."""
        batch = self._admit(now)
        if batch:
            new_and_context = [(r.admission.enc.prompt_len - r.context, r.context) for r in batch]
            self.busy_until = now + self.cost.prefill_batch_s(new_and_context)
            for r in batch:
                if math.isnan(r.served.first_token):  # a retracted request's re-prefill emits no first token
                    r.served.admitted_at = now
                    r.served.first_token = self.busy_until
                r.context = r.admission.enc.prompt_len
                r.left -= 1  # a prefill step samples the next output token
                r.admission = self.cache.checkpoint(r.admission, r.served.arrival)
            self.running.extend(batch)
            self._blocked = None
        elif self.running:
            self._make_room_to_decode()
            slots = self.cache.decode_slots(len(self.running))
            assert slots is not None, "retraction leaves room for one decode step"
            self.busy_until = now + self.cost.decode_step_s(len(self.running), sum(r.context for r in self.running))
            for r, slot in zip(self.running, slots):
                r.output_slots.append(slot)
                r.context += 1
                r.left -= 1
        else:
            self.busy_until = now
            if not self.waiting:
                self.new_token_ratio = NEW_TOKEN_RATIO
        self.busy_s += self.busy_until - now
        refused, self._refused = self._refused, []
        done = [r for r in self.running if r.left <= 0]
        if done:
            self._blocked = None
            self.running = [r for r in self.running if r.left > 0]
            for r in done:
                r.served.finished = self.busy_until
                self.cache.finish(r.admission, r.served.arrival, r.output_slots)
                self.policy.on_release(r.admission.tags, r.served.finished)
        return refused + [r.served for r in done]

    def _make_room_to_decode(self) -> None:
        """SGLang's retract_decode: where the free and evictable slots cannot take one more token of every running
        request, put back in the queue those that generated least (then those with the longest prompts) until
        they can; their output so far is freed, to be computed again. The share of the running requests'
        remaining output that admissions count is then re-estimated; else it decays."""
        if self.cache.room() >= len(self.running):
            self.new_token_ratio = max(self.new_token_ratio - NEW_TOKEN_RATIO_DECAY, MIN_NEW_TOKEN_RATIO)
            return
        keep = sorted(self.running, key=lambda r: (r.generated, -r.served.prompt_tokens))
        keep.reverse()  # most preferred first: the last is retracted first
        while len(keep) > 1 and (len(keep) == len(self.running) or self.cache.room() < len(keep)):
            r = keep.pop()
            self.cache.retract(r.admission, r.output_slots, len(keep) * RETRACT_DECODE_STEPS)
            enc = r.admission.enc._replace(prompt_len=r.served.prompt_tokens + r.generated)
            r.served.retracted += 1
            self.waiting.append(_Waiting(r.served, enc, r.admission.tags, r.left))
        kept = {id(r) for r in keep}
        self.running = [r for r in self.running if id(r) in kept]
        decoded = sum(r.generated for r in keep)
        wanted = sum(r.served.output_tokens for r in keep)
        self.new_token_ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(keep)) / (wanted + 1))
        self._blocked = None

    def _admit(self, now: float) -> list[_Running]:
        """A prefill batch, first come first served, within the token budget and what the KV pool can hold.

        A request larger than the whole cache is refused (SGLang never admits it) and goes to `_refused`.
        """
        batch: list[_Running] = []
        new_tokens = 0
        # What the running requests are expected to write still; a request admitted to this batch counts whole.
        reserved = sum(r.left for r in self.running) * self.new_token_ratio
        while self.waiting:
            served, enc, tags, left = self.waiting[0]
            if self.max_running is not None and len(self.running) + len(batch) >= self.max_running:
                break
            if served is self._blocked:
                break
            computed = self.cache.admissible(enc, left, reserved)
            if computed is None:
                if batch or self.running:
                    self._blocked = served
                    break  # waits for running requests to finish and free their slots
                self.waiting.popleft()  # more than the whole cache: never admitted
                self.cache.stats.oversized += 1
                self.policy.on_release(tags, now)
                served.admitted = False
                served.finished = now
                self._refused.append(served)
                continue
            # The budget counts what a prefill computes, not what it reads from cache (SGLang's rem_input_tokens).
            if batch and new_tokens + computed > self.prefill_budget:
                break
            self.waiting.popleft()
            admission = self.cache.admit(enc, tags, output=False)
            assert admission is not None, "admissible() found the slots"
            cached = admission.hit_tokens + admission.loaded_tokens
            if not served.retracted:  # what the request found cached when it came (not on a re-prefill)
                served.hit_tokens, served.loaded_tokens = admission.hit_tokens, admission.loaded_tokens
            new_tokens += enc.prompt_len - cached
            reserved += left
            batch.append(_Running(served, admission, cached, left))
        return batch
