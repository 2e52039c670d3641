"""Workload generators: synthetic multi-agent workflow traces in trace format v1."""

from __future__ import annotations

from collections.abc import Callable

from agentcache.trace import Trace
from agentcache.workloads import chat, code_retry, fact_verify, group_chat, mix, phased_chat, pipeline
from agentcache.workloads.common import GenConfig

FAMILIES: dict[str, Callable[[GenConfig], Trace]] = {
    code_retry.FAMILY: code_retry.generate,
    fact_verify.FAMILY: fact_verify.generate,
    pipeline.FAMILY: pipeline.generate,
    group_chat.FAMILY: group_chat.generate,
    phased_chat.FAMILY: phased_chat.generate,
    chat.FAMILY: chat.generate,
    mix.FAMILY: mix.generate,
}
# Agent apps whose path is decided at run time; plain chat and the mix with it are traffic of another kind.
DYNAMIC_FAMILIES = (code_retry.FAMILY, fact_verify.FAMILY, group_chat.FAMILY, phased_chat.FAMILY)


def generate(family: str, cfg: GenConfig | None = None) -> Trace:
    try:
        make = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown workload family {family!r}; choose from {', '.join(FAMILIES)}") from None
    return make(cfg or GenConfig())


__all__ = ["FAMILIES", "DYNAMIC_FAMILIES", "GenConfig", "generate"]
