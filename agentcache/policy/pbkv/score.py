"""pbkv's eviction key for a node: the retired tier first, then the forecast score, LRU within ties."""

from __future__ import annotations

from agentcache.cost import CostModel
from agentcache.policy.base import CachePolicy
from agentcache.policy.nodes import NO_LATEST, CacheNode, NodeTags, node_tokens, tags_of
from agentcache.policy.pbkv.demand import Demand
from agentcache.policy.pbkv.forecasts import Forecasts
from agentcache.policy.pbkv.hints import Hints
from agentcache.policy.pbkv.ingredients import Ingredients
from agentcache.policy.pbkv.keys import EvictionKeys
from agentcache.policy.pbkv.retired import RetiredAges, RetiredReads, latest_agents
from agentcache.policy.pbkv.reuse import ReuseEvidence
from agentcache.policy.pbkv.timing import Timing


class Ranking:
    """Computes keys from what the policy's parts hold; keeps nothing of its own."""

    def __init__(
        self,
        policy: CachePolicy,
        ingredients: Ingredients,
        cost: CostModel,
        timing: Timing,
        forecasts: Forecasts,
        demand: Demand,
        keys: EvictionKeys,
        reuse: ReuseEvidence,
        retired_reads: RetiredReads,
        retired_ages: RetiredAges,
        hints: Hints,
    ) -> None:
        self.policy = policy
        self.ingredients = ingredients
        self.cost = cost
        self.timing = timing
        self.forecasts = forecasts
        self.demand = demand
        self.keys = keys
        self.reuse = reuse
        self.retired_reads = retired_reads
        self.retired_ages = retired_ages
        self.hints = hints

    def score(self, node: CacheNode, t: NodeTags | None = None) -> float:
        """Expected discounted reads of `node` (the paper's Score, plus the fixed-prompt terms)."""
        t = t if t is not None else tags_of(node)
        if t is None:
            return 0.0
        ingredients, demand = self.ingredients, self.demand
        fixed = t.fixed_agents if ingredients.fixed_by_forecast else ()
        total = 0.0
        if fixed:
            keyed = demand.keyed
            for agent in fixed:
                total += keyed.get(agent, 0.0)
            if not t.past_fixed:  # every workflow's agents are among `fixed`: a shared prompt, no more
                return total
        current_only, reuse, done_of = ingredients.current_paths, ingredients.reuse, self.hints.done
        weights, values_of, pending, latest_of, reuse_evidence = (
            demand.weights,
            self.forecasts.values,
            demand.pending,
            self.policy.latest,
            self.reuse,
        )
        for workflow, agents in t.workflows.items():
            if fixed and agents.keys() <= fixed:  # valued by the demand above (a shared prompt: most workflows)
                continue
            weight = weights.get(workflow)
            if weight is None:  # not active
                continue
            values = values_of.get(workflow)
            waiting = pending.get(workflow)
            latest = latest_of.get(workflow) or NO_LATEST
            done = done_of.get(workflow) if done_of else None
            for a, stamp in agents.items():
                if a in fixed or (done is not None and a in done):
                    continue
                pair = latest.get(a)
                if pair is not None and pair.stamp == stamp:  # on the pair's latest path
                    if pair.reread >= 0:  # told what the pair's next request reads: the node's share of that
                        tokens = node_tokens(node)
                        read = min(max(pair.reread - (t.depth - tokens), 0), tokens) / tokens if tokens else 0.0
                    else:
                        read = reuse_evidence.share(a, pair.region(t.depth)) if reuse else 1.0
                elif current_only:
                    continue
                else:
                    read = 1.0
                if values:
                    total += weight * values.get(a, 0.0) * read
                if a == waiting:
                    total += read
        return total

    def key(self, node: CacheNode, t: NodeTags | None) -> tuple:
        """The eviction key of `node` (tagged `t`), computed afresh."""
        ing = self.ingredients
        tiered = ing.lifecycle and t is not None and not (ing.fixed_by_forecast and t.fixed_agents)
        if (
            tiered
            and t is not None
            and (self.policy.is_retired(t) or (self.hints.done and self.hints.all_done(t, self.policy.registry.by_id)))
        ):
            return self.retired_key(node, t)
        value = self.score(node, t)
        if ing.evidence and t is not None:
            value *= (t.hits + 1) / (t.hits + 2)
        if tiered and t is not None and ing.retired_evidence and value < self.retired_reads.share_of(t):
            return self.retired_key(node, t)  # its own workflows will read it less than others read retired cache
        if ing.cost and value > 0.0:
            depth = t.depth if t is not None else node_tokens(node)
            value *= self.cost.miss_cost_per_token(depth, node_tokens(node), bool(getattr(node, "backuped", False)))
            value /= self.cost.linear_s
        frequency = self.read_rate(t) if ing.fallback and value == 0.0 and t is not None else 0.0
        return (1, value, frequency, node.last_access_time)

    def retired_key(self, node: CacheNode, t: NodeTags) -> tuple:
        """The retired tier's order: with `retired_evidence`, generated output no prompt re-sent yet before
        prompts (a later request that re-sends it reads the prompt above it too); with `retired_ages`, the
        value its age says it has (RetiredAges); LRU within."""
        ingredients, ages = self.ingredients, self.retired_ages
        value = 0.0
        if ingredients.retired_ages and ages.learned:
            # A shared prefix is aged in its own mean interval between reads (RetiredAges.age_unit).
            unit = ages.age_unit(t)
            age = (self.timing.now - t.last_access) / unit
            value = ages.value(latest_agents(t), age, t.stops)
            self.keys.rekey_at(t, t.last_access + ages.bucket_end(age) * unit)
        return (0, float(ingredients.retired_evidence and t.in_prompt), value, node.last_access_time)

    def read_rate(self, t: NodeTags) -> float:
        """Reads per second since the node was written (what it has shown, for nodes no forecast values)."""
        return t.hits / (self.timing.now - t.created + self.timing.gaps.mean + 1e-9)
