"""Control operations, applied in each scheduler process's own thread (so never concurrently with the tree)."""

from __future__ import annotations

import json
import logging
from typing import Any

from agentcache.server_ext.ipc import AgentCacheControl, AgentCacheControlOutput
from agentcache.tags import WorkflowKey

logger = logging.getLogger("agentcache")


def handle_control(scheduler: Any, req: AgentCacheControl) -> AgentCacheControlOutput:
    from agentcache.server_ext.cache import AgentCache

    cache = getattr(scheduler, "tree_cache", None)
    if not isinstance(cache, AgentCache):
        return _reply(
            req,
            False,
            {
                "error": "the agentcache cache is not active: start SGLang with --radix-cache-backend agentcache",
                "reason": "not_enabled",
            },
        )
    try:
        payload = json.loads(req.payload)
        if req.op == "end":
            return _reply(req, True, {"ended": cache.end_workflow(_key(payload), float(payload["ts"]))})
        if req.op == "stats":
            return _reply(req, True, cache.stats(str(payload.get("tenant", "")), bool(payload.get("operator"))))
        if req.op == "workflow":
            return _reply(req, True, cache.workflow_view(_key(payload)))
        if req.op == "expire":
            return _reply(req, True, {"expired": cache.expire(float(payload["ts"]))})
        if req.op == "ping":
            return _reply(req, True, {"policy": cache.config.policy.text})
        return _reply(req, False, {"error": f"unknown control operation {req.op!r}"})
    except Exception as exc:  # a bad control message must not take the scheduler down
        logger.exception("agentcache: control operation %r failed", req.op)
        return _reply(req, False, {"error": f"{type(exc).__name__}: {exc}"})


def _key(payload: dict[str, Any]) -> WorkflowKey:
    return WorkflowKey(str(payload.get("tenant", "")), str(payload["workflow"]))


def _reply(req: AgentCacheControl, ok: bool, result: dict[str, Any]) -> AgentCacheControlOutput:
    return AgentCacheControlOutput(rid=req.rid, ok=ok, result=json.dumps(result))
