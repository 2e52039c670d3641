"""Plugin settings: set by `--agentcache-*` flags in the launcher, read by every scheduler process.

The launcher's flags are exported as environment variables before SGLang
spawns its children, which inherit them; the same variables configure the
plugin when SGLang is started some other way.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from agentcache.policy.spec import PolicyConfigError, PolicySpec
from agentcache.predictor.spec import PredictorSpec

POLICY_ENV = "AGENTCACHE_POLICY"
LEASE_ENV = "AGENTCACHE_LEASE_S"
CALL_GRAPH_ENV = "AGENTCACHE_CALL_GRAPH"  # JSON file {agent: [successors]}, for kvflow
PREDICTOR_ENV = "AGENTCACHE_PREDICTOR"  # pbkv's forecaster: markov, markov-n:N, neural:MODEL.pt
PREFETCH_ENV = "AGENTCACHE_PREFETCH"  # conservative (default; needs HiCache and pbkv) or off
PREFETCH_MODES = ("conservative", "off")
# Read by the HTTP process alone (server_ext/tenancy.py): a key per tenant, and whether tenants share cached prefixes.
API_KEYS_FILE_ENV = "AGENTCACHE_API_KEYS_FILE"  # `name: key` lines; the name `operator` is the operator's key
SALT_PER_TENANT_ENV = "AGENTCACHE_SALT_PER_TENANT"  # 1: each principal's prompts in a radix namespace of its own
# Active workflows a keyed tenant may hold (the operator's have the server's cap alone): past it, its own oldest retire.
MAX_WORKFLOWS_PER_TENANT_ENV = "AGENTCACHE_MAX_WORKFLOWS_PER_TENANT"
DEFAULT_MAX_WORKFLOWS_PER_TENANT = 10_000
DEFAULT_POLICY = "pbkv"
DEFAULT_LEASE_S = 300.0


class ConfigError(ValueError):
    pass


@dataclass(frozen=True)
class SettingNames:
    """What each setting is called where the user gave it (an environment variable, or a command's flag): the
    errors name it so."""

    policy: str = POLICY_ENV
    lease: str = LEASE_ENV
    call_graph: str = CALL_GRAPH_ENV
    predictor: str = PREDICTOR_ENV
    prefetch: str = PREFETCH_ENV
    # Where a policy the plugin does not run is asked for: how to get what it offers instead.
    other_policies: str = (
        "prefetch is --agentcache-prefetch; SGLang's own strategies need no plugin: --radix-eviction-policy"
    )


ENV_NAMES = SettingNames()


@dataclass(frozen=True)
class PluginConfig:
    policy: PolicySpec = PolicySpec.parse(DEFAULT_POLICY)
    lease_s: float = DEFAULT_LEASE_S
    call_graph: dict[str, list[str]] | None = None
    call_graph_path: str | None = None
    predictor: PredictorSpec | None = None
    prefetch: str = "conservative"
    max_workflows_per_tenant: int = DEFAULT_MAX_WORKFLOWS_PER_TENANT

    @classmethod
    def from_env(cls, names: SettingNames = ENV_NAMES) -> PluginConfig:
        """The settings, checked: a bad one raises ConfigError naming the variable (or, in `names`, the flag that
        set it) and what is wrong."""
        config = cls.checked(
            os.environ.get(POLICY_ENV, DEFAULT_POLICY),
            os.environ.get(LEASE_ENV, str(DEFAULT_LEASE_S)),
            os.environ.get(CALL_GRAPH_ENV) or None,
            os.environ.get(PREDICTOR_ENV) or None,
            os.environ.get(PREFETCH_ENV, "conservative"),
            names,
        )
        raw_cap = os.environ.get(MAX_WORKFLOWS_PER_TENANT_ENV) or str(DEFAULT_MAX_WORKFLOWS_PER_TENANT)
        try:
            cap = int(raw_cap)
        except ValueError:
            cap = 0
        if cap < 1:
            raise ConfigError(f"{MAX_WORKFLOWS_PER_TENANT_ENV}={raw_cap!r}: expected a whole number >= 1")
        return replace(config, max_workflows_per_tenant=cap)

    @classmethod
    def checked(
        cls,
        raw_policy: str,
        raw_lease: str,
        path: str | None,
        raw_predictor: str | None,
        prefetch: str,
        names: SettingNames = ENV_NAMES,
    ) -> PluginConfig:
        """The settings from their text (what the variables hold): `agentcache serve` checks its flags with this
        before it starts SGLang, the plugin its environment when SGLang loads it."""
        try:
            policy = PolicySpec.parse(raw_policy)
        except PolicyConfigError as exc:
            raise ConfigError(f"{names.policy}={raw_policy!r}: {exc}") from None
        if policy.builtin or not policy.online or policy.prefetch:
            raise ConfigError(
                f"{names.policy}={raw_policy!r}: the plugin runs lru, lifecycle, kvflow, cachescout, pbkv-paper, pbkv"
                f" or a pbkv/ variant ({names.other_policies})"
            )
        try:
            lease = float(raw_lease)
        except ValueError:
            raise ConfigError(f"{names.lease}={raw_lease!r} is not a number of seconds") from None
        if lease <= 0:
            raise ConfigError(f"{names.lease} must be > 0, got {lease}")
        graph = load_call_graph(path, names.call_graph) if path else None
        if policy.name == "kvflow" and graph is None:
            raise ConfigError(f"kvflow needs a static call graph: set {names.call_graph}")
        predictor = None
        if raw_predictor is not None:
            try:
                predictor = PredictorSpec.parse(raw_predictor)
                predictor.build(graph)  # a missing or damaged model file fails here, at start-up, by name
            except (ValueError, OSError) as exc:
                raise ConfigError(f"{names.predictor}={raw_predictor!r}: {exc}") from None
        if prefetch not in PREFETCH_MODES:
            raise ConfigError(f"{names.prefetch}={prefetch!r}: choose from {', '.join(PREFETCH_MODES)}")
        return cls(policy, lease, graph, path, predictor, prefetch)


def load_call_graph(path: str, name: str) -> dict[str, list[str]]:
    """A call graph file: a JSON object {agent: [the agents it may call next]}, agents by the names users know;
    errors say `name` (how the user gave the path)."""
    try:
        with open(path, encoding="utf-8") as fh:
            graph = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{name}={path!r}: {exc}") from None
    if not isinstance(graph, dict) or not all(
        isinstance(v, list) and all(isinstance(b, str) for b in v) for v in graph.values()
    ):
        raise ConfigError(f"{name}={path!r}: expected a JSON object agent -> list of agents")
    if not graph:
        raise ConfigError(f"{name}={path!r}: the call graph names no agent")
    return graph
