"""Where the agentcache server is, and how the SDK talks to it."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_BASE_URL = "http://127.0.0.1:30000"
DEFAULT_EXIT_TIMEOUT_S = 2.0
# The routing key the SDK sends behind an agentcache cluster (sglang-router, manual policy): per request, the
# slot agentcache.routing.WorkflowAwareRouting chose (workflow-aware), or the workflow id (workflow-affinity).
# A plain SGLang server gets the workflow id either way.
ROUTINGS = ("workflow-aware", "workflow-affinity")
DEFAULT_ROUTING = "workflow-aware"


def check_routing(routing: str, source: str = "routing") -> str:
    if routing not in ROUTINGS:
        raise ValueError(f"{source}: unknown routing {routing!r}; choose from {', '.join(ROUTINGS)}")
    return routing


@dataclass
class Settings:
    base_url: str = DEFAULT_BASE_URL  # the SGLang server (or router) with the agentcache plugin
    api_key: str | None = None  # the server's --api-key, for the control routes
    end_timeout_s: float = 10.0  # per attempt; end and tool events are sent in the background
    exit_timeout_s: float = DEFAULT_EXIT_TIMEOUT_S  # the longest the app's exit waits for pending events
    routing: str = DEFAULT_ROUTING  # one of ROUTINGS: the routing key behind an agentcache cluster
    tool_events: bool = True  # tell the server when an agent waits on a tool (agentcache_sdk._tools)
    plan_events: bool = True  # tell the server the app's plan and its framework's decisions (agentcache_sdk._plan)

    def origin(self) -> tuple[str, str, int]:
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return parts.scheme, parts.hostname or "", port

    def targets(self, url: str) -> bool:
        """Whether a request URL goes to the agentcache server (only those are tagged)."""
        parts = urlsplit(str(url))
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return (parts.scheme, parts.hostname or "", port) == self.origin()


def _seconds(variable: str, default: float) -> float:
    text = os.environ.get(variable)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value >= 0.0:  # NaN, or a typo: said at import, naming the variable
        raise ValueError(f"{variable}: expected a number of seconds >= 0, got {text!r}")
    return value


def _switch(variable: str, default: bool) -> bool:
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return default
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{variable}: expected on or off (1/0, true/false, yes/no), got {text!r}")


def _from_env() -> Settings:
    base = os.environ.get("AGENTCACHE_BASE_URL", DEFAULT_BASE_URL).rstrip("/")
    if base.endswith("/v1"):
        base = base[: -len("/v1")]
    return Settings(
        base_url=base,
        api_key=os.environ.get("AGENTCACHE_API_KEY"),
        exit_timeout_s=_seconds("AGENTCACHE_EXIT_TIMEOUT_S", DEFAULT_EXIT_TIMEOUT_S),
        routing=check_routing(os.environ.get("AGENTCACHE_ROUTING") or DEFAULT_ROUTING, "AGENTCACHE_ROUTING"),
        tool_events=_switch("AGENTCACHE_TOOL_EVENTS", True),
        plan_events=_switch("AGENTCACHE_PLAN_EVENTS", True),
    )


settings = _from_env()


def configure(
    base_url: str | None = None,
    api_key: str | None = None,
    end_timeout_s: float | None = None,
    exit_timeout_s: float | None = None,
    routing: str | None = None,
    tool_events: bool | None = None,
    plan_events: bool | None = None,
) -> Settings:
    """Point the SDK at the agentcache server. `base_url` may include the OpenAI `/v1` suffix.

    `routing` (also ``AGENTCACHE_ROUTING``): behind `agentcache serve --workers N`, ``workflow-aware`` (the
    default) sends each request to the worker agentcache.routing.WorkflowAwareRouting chooses for it;
    ``workflow-affinity`` keeps each workflow on one worker. A single server sees no difference.

    `tool_events` (also ``AGENTCACHE_TOOL_EVENTS=off``): False sends no tool events (the server then guesses
    tool pauses from each agent's past gaps, as it does for an app without the SDK); a recording still holds them.

    `plan_events` (also ``AGENTCACHE_PLAN_EVENTS=off``): False sends no plan, next or agent_done events (the server
    then forecasts from what it learns alone); a recording still holds them.
    """
    if routing is not None:
        settings.routing = check_routing(routing)
    if base_url is not None:
        base = base_url.rstrip("/")
        settings.base_url = base[: -len("/v1")] if base.endswith("/v1") else base
    if api_key is not None:
        settings.api_key = api_key
    if end_timeout_s is not None:
        settings.end_timeout_s = end_timeout_s
    if exit_timeout_s is not None:
        settings.exit_timeout_s = exit_timeout_s
    if tool_events is not None:
        settings.tool_events = tool_events
    if plan_events is not None:
        settings.plan_events = plan_events
    return settings
