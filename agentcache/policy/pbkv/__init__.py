"""PBKV: retired cache first, then a K-step forecast score, LRU within ties.

The paper's score (PBKV, Eq. 5):

    Score(c) = sum_{k=1..K} gamma^(k-1) sum_{w in W_act(c)} s_w^(k) * A_w(c)^T P_w^(k)

W_act(c) are the active workflows that touched node c, A_w(c) marks the agents
of w that touched it, P_w^(k) is the forecast of w's k-th next agent and
s_w^(k) the probability that w is still running then. Our predictors' rows are
unconditional with END absorbing, so s_w^(k) * P_w^(k)(a) is row k's p(a) and

    Score(c) = sum_{w in W_act(c)} sum_{a in A_w(c)} v_w(a),   v_w(a) = sum_k gamma^(k-1) P_w^(k)(a)

the expected discounted number of future reads of c (Lemma G.1). Cache that
only ended workflows touched is evicted before any scored node: a fact
outranks an estimate.

That fact fails where a workflow is a single request, as in plain chat: a
conversation's next turn is a workflow of its own and reads what the ended
previous turn wrote, while the turn that just ended forecast almost nothing
for itself. So (retired_evidence) the policy counts how often retired cache
is read again (reads per node retired, fixed prompts aside) and ranks with
the retired tier every node whose own workflows' forecast is worth less than
that; within the tier, generated output that no prompt has re-sent yet goes
before prompts (SGLang's priority order), then LRU. Where retired cache is
never read again, as in agent workflows, the share stays 0 and nothing moves.

As written, the score undervalues an agent's fixed prompt: a workflow that
has not called the agent yet adds nothing to it, nor does a workflow that has
not started. SGLang's LFU protects such prompts through global hit counts,
which is why it beats the paper's score on real traces. Our default adds, as
switchable ingredients (see docs/design/policy.md for what each one is worth):

- fixed_by_forecast: a node of agent a's fixed prompt is worth every active
  workflow's forecast of calling a, ``D(a) = sum_{w active} v_w(a)``, touched or not;
- arrivals: plus the calls of workflows not yet started,
  ``lambda * g * sum_k gamma^(k-1) sum_{j<=k} P_new^(j)(a)``, with lambda the
  workflow arrival rate, g the mean gap between a workflow's requests (both
  learned online) and P_new the forecast for a workflow with an empty path;
- cost: the score is multiplied by what a miss of c costs per token held
  (recompute with its context-length term, or a reload when c has a host copy);
- fallback: nodes no forecast values (tagged by no active workflow's agents,
  or untagged) are ordered by their observed read frequency, then recency;
- reuse: how each agent reuses its own last request's path, learned online
  instead of assumed: when the agent's next request in the workflow arrives,
  how much did it read again of the previous request's context (what that
  request had read from cache after its fixed prompt), of its fresh prompt
  tokens, and of its generated tokens? Appending apps read all three; most
  real multi-agent apps rebuild their prompts from shared context, read the
  context and never the fresh tail; phased ones drop the context when the
  phase changes. A node on a (workflow, agent)'s latest path is valued by the
  agent's share for the part it lies in; where the previous path was evicted
  before the next request came, nothing is learned;
- pending: a request that has arrived but is not served yet (queued behind
  others on a busy server) reads its agent's cache for certain: that agent
  counts one read at step 0 for its workflow until the engine admits the
  request (and holds its prefix). The forecasts have already moved past it,
  to what comes after; the replay admits each request as it arrives, so only
  a live server queues. Most requests are admitted before any eviction sees
  them waiting: a request counts as pending only from the first eviction
  round (or key) while it waits, so one admitted at once costs nothing.

The package, by job: ingredients.py (the switches and the default forecaster), forecasts.py (v_w(a)),
timing.py (the policy clock, phi_w), demand.py (D(a), pending requests), reuse.py and retired.py (the
evidence), keys.py (the eviction keys kept across rounds), score.py (a node's key), policy.py (PBKVPolicy:
the engine's events, handed to those parts).
"""

from __future__ import annotations

from agentcache.policy.pbkv.ingredients import PAPER, Ingredients, default_forecaster
from agentcache.policy.pbkv.policy import PBKVPolicy
from agentcache.policy.pbkv.retired import RetiredAges, RetiredReads
from agentcache.policy.pbkv.reuse import ReuseEvidence
from agentcache.predictor.markov import DEFAULT_ORDER

__all__ = [
    "DEFAULT_ORDER",
    "PAPER",
    "Ingredients",
    "PBKVPolicy",
    "RetiredAges",
    "RetiredReads",
    "ReuseEvidence",
    "default_forecaster",
]
