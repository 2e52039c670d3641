"""The policy core: engine-agnostic eviction policies, one small module each.

Nothing here imports SGLang or an agent framework; see base.py for how an
engine adapter drives a policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agentcache.policy.base import CachePolicy
from agentcache.policy.belady import BeladyPolicy
from agentcache.policy.cachescout import CacheScoutPolicy
from agentcache.policy.kvflow import AgentStepGraph, KVFlowPolicy
from agentcache.policy.lifecycle import LifecyclePolicy
from agentcache.policy.lru import LRUPolicy
from agentcache.policy.nodes import CacheNode, NodeClass, NodeTags, tags_of
from agentcache.policy.pbkv import PAPER, PBKVPolicy
from agentcache.policy.spec import OURS, PolicyConfigError, PolicySpec, parse_policies
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor import MarkovPredictor, Predictor


def make_policy(
    spec: PolicySpec | str,
    *,
    registry: WorkflowRegistry | None = None,
    call_graph: Mapping[str, Sequence[str]] | None = None,
    predictor: Predictor | None = None,
    next_use: Callable[[Any], float] | None = None,
    call_graph_source: str = "the call graph",
) -> CachePolicy:
    """The policy a spec names; raises PolicyConfigError naming what is missing.

    A built-in SGLang strategy (lfu, slru, ...) gets an LRU policy that only keeps tags: SGLang's
    own strategy orders eviction then.
    """
    spec = spec if isinstance(spec, PolicySpec) else PolicySpec.parse(spec)
    name = spec.name
    if name == "lru" or spec.builtin:
        return LRUPolicy(registry)
    if name == "lifecycle":
        return LifecyclePolicy(registry)
    if name == "kvflow":
        if not call_graph:
            raise PolicyConfigError("kvflow needs a static call graph (a trace's meta call_graph, or --call-graph)")
        return KVFlowPolicy(AgentStepGraph(call_graph, source=call_graph_source), registry)
    if name == "cachescout":
        return CacheScoutPolicy(registry)
    if name == "pbkv-paper":
        # The paper's score with an online Markov-1 forecaster (a stand-in for its GraphSAGE model), forecasting
        # afresh at every request as that model does, over the paper's K = 3 (pbkv's is DEFAULT_HORIZON): `--predictor
        # markov` is the one re-rolled at serving pace.
        return PBKVPolicy(registry, predictor or MarkovPredictor(order=1, horizon=3), ingredients=PAPER)
    if name == "pbkv":
        return PBKVPolicy(registry, predictor, ingredients=spec.ingredients)
    if next_use is None:
        raise PolicyConfigError("belady is offline: it needs the whole trace (replay only)")
    return BeladyPolicy(next_use, registry)


__all__ = [
    "OURS",
    "AgentStepGraph",
    "CacheNode",
    "CachePolicy",
    "NodeClass",
    "NodeTags",
    "PolicyConfigError",
    "PolicySpec",
    "WorkflowRegistry",
    "WorkflowState",
    "make_policy",
    "parse_policies",
    "tags_of",
]
