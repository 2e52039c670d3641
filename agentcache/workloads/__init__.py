"""Workload generators: synthetic multi-agent workflow traces in trace format v1."""

from __future__ import annotations

from collections.abc import Callable

from agentcache.trace import Trace
from agentcache.workloads import chat, code_retry, fact_verify, group_chat, mix, phased_chat, pipeline, tool_use
from agentcache.workloads.common import GenConfig

FAMILIES: dict[str, Callable[[GenConfig], Trace]] = {
    code_retry.FAMILY: code_retry.generate,
    fact_verify.FAMILY: fact_verify.generate,
    pipeline.FAMILY: pipeline.generate,
    group_chat.FAMILY: group_chat.generate,
    phased_chat.FAMILY: phased_chat.generate,
    chat.FAMILY: chat.generate,
    mix.FAMILY: mix.generate,
    tool_use.FAMILY: tool_use.generate,
}
# Agent apps whose path is decided at run time; plain chat and the mix with it are traffic of another kind.
DYNAMIC_FAMILIES = (code_retry.FAMILY, fact_verify.FAMILY, group_chat.FAMILY, phased_chat.FAMILY)
# Families with a held-out variant (GenConfig.held_out): other agents, tools and durations.
HELD_OUT_FAMILIES = (tool_use.FAMILY,)


def generate(family: str, cfg: GenConfig | None = None) -> Trace:
    try:
        make = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown workload family {family!r}; choose from {', '.join(FAMILIES)}") from None
    cfg = cfg or GenConfig()
    if cfg.held_out and family not in HELD_OUT_FAMILIES:
        raise ValueError(f"{family} has no held-out variant; {', '.join(HELD_OUT_FAMILIES)} has one")
    return make(cfg)


__all__ = ["FAMILIES", "DYNAMIC_FAMILIES", "HELD_OUT_FAMILIES", "GenConfig", "generate"]
