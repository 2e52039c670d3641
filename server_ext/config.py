"""Plugin settings: set by `--agentcache-*` flags in the launcher, read by every scheduler process.

The launcher's flags are exported as environment variables before SGLang
spawns its children, which inherit them; the same variables configure the
plugin when SGLang is started some other way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

POLICY_ENV = "AGENTCACHE_POLICY"
LEASE_ENV = "AGENTCACHE_LEASE_S"
CALL_GRAPH_ENV = "AGENTCACHE_CALL_GRAPH"  # JSON file {agent: [successors]}, for kvflow
PREDICTOR_ENV = "AGENTCACHE_PREDICTOR"  # pbkv's forecaster: markov, markov-n:N, neural:MODEL.pt
PREFETCH_ENV = "AGENTCACHE_PREFETCH"  # conservative (default; needs HiCache and pbkv) or off
PREFETCH_MODES = ("conservative", "off")
DEFAULT_POLICY = "pbkv"
DEFAULT_LEASE_S = 300.0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class PluginConfig:
    policy: str = DEFAULT_POLICY
    lease_s: float = DEFAULT_LEASE_S
    call_graph: dict[str, list[str]] | None = None
    predictor: str | None = None
    prefetch: str = "conservative"

    @classmethod
    def from_env(cls) -> PluginConfig:
        from agentcache.policy import ONLINE_POLICIES

        policy = os.environ.get(POLICY_ENV, DEFAULT_POLICY)
        if policy not in ONLINE_POLICIES and not policy.startswith("pbkv/"):
            raise ConfigError(f"{POLICY_ENV}={policy!r}: choose from {', '.join(ONLINE_POLICIES)}")
        raw = os.environ.get(LEASE_ENV, str(DEFAULT_LEASE_S))
        try:
            lease = float(raw)
        except ValueError:
            raise ConfigError(f"{LEASE_ENV}={raw!r} is not a number of seconds") from None
        if lease <= 0:
            raise ConfigError(f"{LEASE_ENV} must be > 0, got {lease}")
        graph = None
        path = os.environ.get(CALL_GRAPH_ENV)
        if path:
            try:
                with open(path, encoding="utf-8") as fh:
                    graph = json.load(fh)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"{CALL_GRAPH_ENV}={path!r}: {exc}") from None
            if not isinstance(graph, dict) or not all(
                isinstance(v, list) and all(isinstance(b, str) for b in v) for v in graph.values()
            ):
                raise ConfigError(f"{CALL_GRAPH_ENV}={path!r}: expected a JSON object agent -> list of agents")
        if policy == "kvflow" and graph is None:
            raise ConfigError(f"kvflow needs a static call graph: set {CALL_GRAPH_ENV} (--agentcache-call-graph)")
        predictor = os.environ.get(PREDICTOR_ENV) or None
        if predictor is not None:
            from agentcache.predictor import load_predictor
            from agentcache.trace import Meta

            try:
                load_predictor(predictor, Meta(call_graph=graph))
            except (ValueError, OSError) as exc:
                raise ConfigError(f"{PREDICTOR_ENV}={predictor!r}: {exc}") from None
        prefetch = os.environ.get(PREFETCH_ENV, "conservative")
        if prefetch not in PREFETCH_MODES:
            raise ConfigError(f"{PREFETCH_ENV}={prefetch!r}: choose from {', '.join(PREFETCH_MODES)}")
        return cls(policy, lease, graph, predictor, prefetch)
