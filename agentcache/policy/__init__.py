"""The policy core: engine-agnostic eviction policies, one small module each.

Nothing here imports SGLang or an agent framework; see base.py for how an
engine adapter drives a policy.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from agentcache.policy.base import CacheNode, CachePolicy, NodeClass, NodeTags, RequestTags, tags_of
from agentcache.policy.belady import BeladyPolicy
from agentcache.policy.cachescout import CacheScoutPolicy
from agentcache.policy.kvflow import AgentStepGraph, KVFlowPolicy
from agentcache.policy.lifecycle import LifecyclePolicy
from agentcache.policy.lru import LRUPolicy
from agentcache.policy.pbkv import PAPER, Ingredients, PBKVPolicy
from agentcache.policy.workflows import WorkflowRegistry, WorkflowState
from agentcache.predictor import MarkovPredictor, Predictor

ONLINE_POLICIES = ("lru", "lifecycle", "kvflow", "cachescout", "pbkv-paper", "pbkv")
POLICIES = (*ONLINE_POLICIES, "belady")


class PolicyConfigError(ValueError):
    """A policy was asked for without what it needs (a call graph, an oracle, ...)."""


def parse_ingredients(name: str) -> Ingredients:
    """`pbkv/-timing/+cost`: the default pbkv with named ingredients switched off (-) or on (+), for ablations."""
    ingredients = Ingredients()
    for part in name.split("/")[1:]:
        field_name = part[1:].replace("-", "_")
        if part[:1] not in ("-", "+") or field_name not in Ingredients.__dataclass_fields__:
            known = ", ".join(f"[+-]{f.replace('_', '-')}" for f in Ingredients.__dataclass_fields__)
            raise PolicyConfigError(f"{name!r}: unknown ingredient {part!r}; use {known}")
        ingredients = replace(ingredients, **{field_name: part[0] == "+"})
    return ingredients


def make_policy(
    name: str,
    *,
    registry: WorkflowRegistry | None = None,
    call_graph: Mapping[str, Sequence[str]] | None = None,
    predictor: Predictor | None = None,
    next_use: Callable[[Any], float] | None = None,
) -> CachePolicy:
    """Build a policy by name; raises PolicyConfigError naming what is missing."""
    if name == "lru":
        return LRUPolicy(registry)
    if name == "lifecycle":
        return LifecyclePolicy(registry)
    if name == "kvflow":
        if not call_graph:
            raise PolicyConfigError("kvflow needs a static call graph (the trace's meta call_graph)")
        return KVFlowPolicy(AgentStepGraph(call_graph), registry)
    if name == "cachescout":
        return CacheScoutPolicy(registry)
    if name == "pbkv-paper":
        # The paper's score with an online Markov-1 forecaster (issue 2's stand-in for its GraphSAGE model).
        return PBKVPolicy(registry, predictor or MarkovPredictor(order=1, horizon=3), ingredients=PAPER)
    if name == "pbkv" or name.startswith("pbkv/"):
        return PBKVPolicy(registry, predictor, ingredients=parse_ingredients(name))
    if name == "belady":
        if next_use is None:
            raise PolicyConfigError("belady is offline: it needs the whole trace (replay only)")
        return BeladyPolicy(next_use, registry)
    raise PolicyConfigError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")


__all__ = [
    "POLICIES",
    "ONLINE_POLICIES",
    "AgentStepGraph",
    "CacheNode",
    "CachePolicy",
    "NodeClass",
    "NodeTags",
    "PolicyConfigError",
    "RequestTags",
    "WorkflowRegistry",
    "WorkflowState",
    "make_policy",
    "tags_of",
]
