"""Workflow-aware routing: which worker a request should go to, decided by the client from what it knows.

sglang-router's ``cache_aware`` policy guesses, from prompt text, where a
prefix is cached. A client that tags its requests knows more: which workflow
and agent a request belongs to, how long its prompt and its agent's fixed
prompt are, and where it sent that workflow's earlier requests. It can then
route each request itself, through the real router's ``manual`` policy: the
SDK (agentcache_sdk._routing) sends ``x-smg-routing-key: agentcache-worker-<slot>``,
and ``agentcache serve --workers N`` has placed those N keys on N different
workers (server_ext/router.py: ``min_group`` alone does not, since it counts
only keys with a request in flight), so a slot is a worker. No proxy of our
own sits in the path.

:class:`WorkflowAwareRouting` keeps each agent on few slots, as many as its
share of the KV memory needs: an agent whose recent requests take a share `p`
of the KV occupancy gets p x N x headroom home slots, rounded to the nearest
(at least one), taken where the least occupancy is homed already, so each slot
keeps few fixed prompts and the agents' load is spread. Rounded, not up: the
homes of all agents then add up to about N, where rounding up gives an agent a
whole second home for a fifth of a slot's traffic, a second copy of its fixed
prompt and its conversations split; the bound below spills what a home cannot
carry. A request's occupancy is the KV it holds times how
long it holds it (token-seconds, the cost model's: its prefill past the fixed
prompt, then a decode step per output token its agent is expected to write,
learned from the answers). Memory is what a worker runs out of first; prompt
tokens alone would misjudge it: an agent that re-reads a long cached prompt to
write a few tokens (a group chat's speaker selector) holds its KV briefly. Each request
then goes to the candidate slot with the largest expected saved prefill (in
the cost model's seconds):

- the length of this agent's conversation (its previous prompt in it) where
  that conversation's last request went; a conversation is the workflow, or
  the thread the prompt continues (its first message after the fixed prompt,
  which the client has), for clients whose workflows are single requests;
- else the agent's fixed prompt on one of its home slots;
- else nothing;

ties going to the slot with fewer requests in flight (routed, not answered:
the queue it would wait behind). Candidates are the slots whose requests in flight stay
within `max_imbalance` x the least loaded slot's, or `slack` requests above
it (sglang-router's balance rule, with thresholds that trip far sooner than
its 64): that bounds the imbalance, and a request whose homes are all past
the bound spills to another slot (which does not become a home).

Every input is the client's own: the decision is a pure function of the
request's workflow, agent, conversation, prompt and fixed-prompt lengths and
of what this object routed and saw answered before. Plain Python, no engine import, so the
SDK can run it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass

from agentcache.cost import DEFAULT_COST, CostModel

SLOT_KEY_PREFIX = "agentcache-worker-"
DEFAULT_MAX_IMBALANCE = 1.5
DEFAULT_HEADROOM = 1.0
DEFAULT_SLACK = 8  # requests in flight above the least loaded slot, allowed whatever the ratio
DEFAULT_HALF_LIFE = 200.0  # requests
MAX_CONVERSATIONS = 100_000  # remembered, least recently used dropped first


def slot_key(slot: int) -> str:
    """The routing key that sends a request to `slot` (the router's manual policy, min_group assignment)."""
    return f"{SLOT_KEY_PREFIX}{slot}"


@dataclass
class Placement:
    """One routed request, until it is answered: where it went, and what it was expected to compute there."""

    slot: int
    new_tokens: int  # prompt tokens expected to be computed (not served from the slot's cache)
    agent: str = ""  # whose request: its answer's output length teaches the agent's expected output


@dataclass
class _Slot:
    in_flight: int = 0  # requests routed here and not answered yet


class WorkflowAwareRouting:
    """Chooses a slot (worker) per request: the largest expected saved prefill, within a bound on imbalance of
    requests in flight (the queueing it adds)."""

    def __init__(
        self,
        workers: int,
        *,
        max_imbalance: float = DEFAULT_MAX_IMBALANCE,
        headroom: float = DEFAULT_HEADROOM,
        half_life: float = DEFAULT_HALF_LIFE,
        slack: int = DEFAULT_SLACK,
        cost: CostModel = DEFAULT_COST,
    ):
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_imbalance < 1.0:
            raise ValueError(f"max_imbalance must be >= 1, got {max_imbalance}")
        if not half_life >= 1.0:
            raise ValueError(f"half_life must be >= 1 request, got {half_life}")
        self.max_imbalance = max_imbalance
        self.headroom = headroom
        self.slack = max(1, slack)
        self.cost = cost
        self.slots = [_Slot() for _ in range(workers)]
        self._decay = 0.5 ** (1.0 / half_life)
        self._half_life = half_life
        self._weight: dict[str, float] = {}  # agent -> its requests' KV occupancy (token-seconds), decayed per request
        self._total_weight = 0.0
        # agent -> (mean output tokens of its answers, answers counted); the mean over every agent's answers
        self._output: dict[str, tuple[float, int]] = {}
        self._mean_output = (0.0, 0)
        self.agent_slots: dict[str, list[int]] = {}  # agent -> the slots that keep its fixed prompt (its homes)
        # (conversation, agent) -> (slot of the conversation's last request, that request's prompt length)
        self._conversations: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._workflow_slots: dict[str, set[int]] = {}  # the slots that served each live workflow

    def expected_saved(self, slot: int, conversation: str, agent: str, fixed_tokens: int) -> int:
        """Prompt tokens `slot` is expected to hold for this request: its conversation, else its fixed prompt."""
        home = self._conversations.get((conversation, agent))
        if home is not None and home[0] == slot:
            return home[1]
        return fixed_tokens if slot in self.agent_slots.get(agent, ()) else 0

    def expected_output(self, agent: str) -> float:
        """Output tokens the agent's next answer is expected to have: its answers' mean, else every agent's."""
        return self._output.get(agent, self._mean_output)[0]

    def occupancy(self, agent: str, prompt_tokens: int, fixed_tokens: int) -> float:
        """What a request of `agent` takes from one of its homes, in token-seconds of KV memory (the resource a
        worker runs out of first): the KV it holds, its prompt and on average half its expected output, for as
        long as it runs, the prefill of its prompt past the fixed prompt cached there (a conversation's history
        may have been evicted, or live elsewhere) and then one decode step per expected output token."""
        output = self.expected_output(agent)
        cached = min(fixed_tokens, max(0, prompt_tokens - 1))
        running_s = self.cost.prefill_s(prompt_tokens - cached, cached) + output * self.cost.step_s
        return (prompt_tokens + output / 2) * running_s

    def homes_needed(self, agent: str) -> int:
        """How many slots an agent's requests need: its share of recent KV occupancy x N x headroom, rounded to
        the nearest (halves up), at least one."""
        share = self._weight.get(agent, 0.0) / self._total_weight if self._total_weight else 1.0
        return max(1, min(len(self.slots), math.floor(share * len(self.slots) * self.headroom + 0.5)))

    def homed_traffic(self) -> list[float]:
        """Per slot, the recent KV occupancy of the agents homed there (an agent's split evenly over its homes)."""
        homed = [0.0] * len(self.slots)
        for agent, homes in self.agent_slots.items():
            for slot in homes:
                homed[slot] += self._weight.get(agent, 0.0) / len(homes)
        return homed

    def _update_homes(self, agent: str, occupancy: float) -> list[int]:
        """Count the request's KV occupancy in its agent's share, and fit the agent's homes to it.

        An agent gets or drops homes as its share needs (a new home where the least traffic is homed, the
        busiest dropped first), and moves its busiest home to the least busy slot when that evens the homed
        traffic by more than a quarter of its own (so two agents never trade homes back and forth).
        """
        for other in self._weight:
            self._weight[other] *= self._decay
        self._total_weight = self._total_weight * self._decay + occupancy
        self._weight[agent] = self._weight.get(agent, 0.0) + occupancy
        homes = self.agent_slots.setdefault(agent, [])
        needed = self.homes_needed(agent)
        while len(homes) > needed:
            homed = self.homed_traffic()
            homes.remove(max(homes, key=homed.__getitem__))
        while len(homes) < needed:
            homed = self.homed_traffic()
            homes.append(min((i for i in range(len(self.slots)) if i not in homes), key=homed.__getitem__))
        others = [i for i in range(len(self.slots)) if i not in homes]
        if others:
            homed = self.homed_traffic()
            own = self._weight[agent] / len(homes)
            busiest = max(homes, key=homed.__getitem__)
            idlest = min(others, key=homed.__getitem__)
            if homed[idlest] + own < homed[busiest] - own / 4:
                homes[homes.index(busiest)] = idlest
        return homes

    def candidates(self) -> list[int]:
        """Slots this request may go to: those that stay within `max_imbalance` x the least loaded's requests
        in flight, or `slack` requests above it (sglang-router's balance rule, with a small absolute slack)."""
        low = min(s.in_flight for s in self.slots)
        bound = max(low + self.slack, self.max_imbalance * low)
        return [i for i, s in enumerate(self.slots) if s.in_flight + 1 <= bound]

    def choose(
        self, workflow: str, agent: str, prompt_tokens: int, fixed_tokens: int, conversation: str | None = None
    ) -> Placement:
        """Route one request; hand the Placement back to `answered` when its answer arrives.

        `conversation` names the thread the prompt continues (the SDK: a hash of the first message after
        the fixed prompt); by default the workflow, which is that thread when a client tags its workflows.
        """
        conversation = workflow if conversation is None else conversation
        self._update_homes(agent, self.occupancy(agent, prompt_tokens, fixed_tokens))
        best: tuple[tuple[float, int], int, int] | None = None
        for slot in self.candidates():
            saved = min(self.expected_saved(slot, conversation, agent, fixed_tokens), max(0, prompt_tokens - 1))
            gain = self.cost.prefill_s(prompt_tokens, 0) - self.cost.prefill_s(prompt_tokens - saved, saved)
            score = (gain, -self.slots[slot].in_flight)
            if best is None or score > best[0]:
                best = (score, slot, prompt_tokens - saved)
        assert best is not None
        _, slot, new_tokens = best
        self.slots[slot].in_flight += 1
        self._conversations[(conversation, agent)] = (slot, prompt_tokens)
        self._conversations.move_to_end((conversation, agent))
        if len(self._conversations) > MAX_CONVERSATIONS:
            self._conversations.popitem(last=False)
        self._workflow_slots.setdefault(workflow, set()).add(slot)
        return Placement(slot, new_tokens, agent)

    def answered(self, placement: Placement, output_tokens: int | None = None) -> None:
        """The request's answer came back: it no longer queues on its slot; its output length (where the
        answer reports it) updates its agent's expected output."""
        self.slots[placement.slot].in_flight -= 1
        if output_tokens is not None and output_tokens >= 0 and placement.agent:
            self._output[placement.agent] = self._averaged(self._output.get(placement.agent), output_tokens)
            self._mean_output = self._averaged(self._mean_output, output_tokens)

    def _averaged(self, mean: tuple[float, int] | None, sample: int) -> tuple[float, int]:
        """A running mean of the first `half_life` samples, then an exponential average weighing each new one
        1 / half_life."""
        value, count = mean if mean is not None else (0.0, 0)
        count += 1
        return value + (sample - value) / min(count, self._half_life), count

    def ended(self, workflow: str) -> set[int]:
        """Forget a finished workflow; the slots that served it (its end event goes to each). Its conversations
        are kept (least recently used dropped first): a later workflow may continue one."""
        return self._workflow_slots.pop(workflow, set())
