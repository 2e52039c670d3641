"""Control operations between the HTTP process and the scheduler processes.

In the HTTP process, :class:`ControlChannel` sends each call (end a workflow, a
batch of tool events, statistics, a workflow's view, the clock tick, a ping) to every scheduler over
SGLang's own channel and matches each reply to its call; :class:`ExpiryTicker`
sends the clock so that leases run out on an idle server too. In each
scheduler, :func:`handle_control` applies the call in the scheduler's own
thread (so never concurrently with the tree), in the order SGLang delivers it
to every rank.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentcache.server_ext.ipc import AgentCacheControl, AgentCacheControlOutput
from agentcache.tags import WorkflowKey

logger = logging.getLogger("agentcache")

CONTROL_TIMEOUT_ENV = "AGENTCACHE_CONTROL_TIMEOUT_S"
DEFAULT_CONTROL_TIMEOUT_S = 30.0


def server_clock() -> float:
    """The policy clock: the HTTP process's time, stamped on each tagged prompt (intake.py), end, tool event and
    tick as it arrives, so that every scheduler rank sees one clock and decides alike."""
    return time.time()


# ---------------------------------------------------------------- the HTTP process's end


class ControlError(RuntimeError):
    """A control call that got no (good) answer: the scheduler timed out, or said what went wrong."""

    def __init__(self, message: str, reason: str = "error"):
        super().__init__(message)
        self.reason = reason  # "timeout", "not_enabled" (no agentcache cache in the scheduler), or "error"


@dataclass
class _Call:
    done: asyncio.Future
    expected: int
    replies: list[Any] = field(default_factory=list)


class ControlChannel:
    """Control calls to every scheduler over SGLang's own channel, each reply matched to its call by id.

    A call that times out is forgotten, so its reply, should the scheduler send it later, is dropped
    (and counted) instead of answering whoever calls next: no caller can receive another's answer.
    Calls may be in flight together; each collects one reply per data-parallel group.
    """

    def __init__(self, send: Callable[[Any], None], fan_out: int):
        self._send = send
        self._fan_out = fan_out
        self._calls: dict[str, _Call] = {}
        self.late_replies = 0

    async def call(self, op: str, payload: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        rid = f"agentcache-{uuid.uuid4().hex}"
        call = self._calls[rid] = _Call(asyncio.get_running_loop().create_future(), self._fan_out)
        try:
            self._send(AgentCacheControl(rid=rid, op=op, payload=json.dumps(payload)))
            outs = await asyncio.wait_for(call.done, timeout_s)
        except TimeoutError:
            raise ControlError(f"the scheduler did not answer within {timeout_s:.0f} s", "timeout") from None
        finally:
            del self._calls[rid]
        replies = [json.loads(o.result) for o in outs]
        for out, reply in zip(outs, replies):
            if not out.ok:
                raise ControlError(reply.get("error", "control operation failed"), reply.get("reason", "error"))
        return replies

    def on_reply(self, out: Any) -> None:
        call = self._calls.get(out.rid)
        if call is None or call.done.done():
            self.late_replies += 1  # its caller gave up: the answer is nobody else's
            return
        call.replies.append(out)
        if len(call.replies) == call.expected:
            call.done.set_result(call.replies)


def control_timeout_s() -> float:
    raw = os.environ.get(CONTROL_TIMEOUT_ENV)
    try:
        return float(raw) if raw else DEFAULT_CONTROL_TIMEOUT_S
    except ValueError:
        return DEFAULT_CONTROL_TIMEOUT_S


def control_channel() -> ControlChannel:
    """The HTTP process's channel to its schedulers, made on first use (the tokenizer manager exists by then)."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.runtime_context import get_parallel
    from sglang.utils import TypeBasedDispatcher

    tm = http_server.get_global_state().tokenizer_manager
    channel = getattr(tm, "_agentcache_channel", None)
    if channel is None:
        channel = ControlChannel(tm._dispatch_to_scheduler, get_parallel().num_dp_ranks)
        tm._result_dispatcher += TypeBasedDispatcher([(AgentCacheControlOutput, channel.on_reply)])
        tm._agentcache_channel = channel
    tm.auto_create_handle_loop()
    return channel


async def control(op: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one control operation to every scheduler; the replies of each data-parallel rank zero."""
    return await control_channel().call(op, payload, control_timeout_s())


class ExpiryTicker:
    """Sends the HTTP process's clock to the schedulers now and then, so leases run out on an idle server.

    Leases are checked against the policy clock, which moves with tagged requests; without ticks a
    workflow nobody ended would stay active until the next tagged request. A tick retires no workflow
    with a request in flight (leases count from the last arrival or release: agentcache.policy.workflows).
    The tick is a control message, so every tensor-parallel rank applies it at the same point of its
    request stream.
    Started by the first generate or control request (in the event loop); stops for good when the
    schedulers do not run the agentcache cache.
    """

    def __init__(self) -> None:
        self._task: asyncio.Task | None = None
        self.stopped = False

    @staticmethod
    def interval_s() -> float:
        from agentcache.server_ext.config import DEFAULT_LEASE_S, LEASE_ENV

        try:
            lease = float(os.environ.get(LEASE_ENV) or DEFAULT_LEASE_S)
        except ValueError:
            lease = DEFAULT_LEASE_S
        return min(max(lease / 4.0, 0.5), 30.0)

    def start(self) -> None:
        if self._task is not None or self.stopped:
            return
        try:
            self._task = asyncio.get_running_loop().create_task(self._run())
        except RuntimeError:  # no event loop here (never the case in the HTTP process)
            return

    async def _run(self) -> None:
        interval = self.interval_s()
        while True:
            await asyncio.sleep(interval)
            try:
                await control("expire", {"ts": server_clock()})
            except ControlError as exc:
                if exc.reason == "not_enabled":  # a server without the agentcache cache: nothing to expire
                    self.stopped = True
                    return
            except Exception:  # the ticker must never die of a transient fault
                logger.exception("agentcache: lease tick failed")


expiry_ticker = ExpiryTicker()


# ---------------------------------------------------------------- each scheduler's end


def handle_control(scheduler: Any, req: AgentCacheControl) -> AgentCacheControlOutput:
    from agentcache.server_ext.cache import AgentCache
    from agentcache.server_ext.control_limits import Page
    from agentcache.server_ext.views import workflow_view

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
        if req.op == "tool_events":  # every client event (tool calls, plans, decisions): server_ext/client_events.py
            tenant, events = str(payload.get("tenant", "")), payload["events"]
            return _reply(req, True, {"applied": cache.client_events(tenant, float(payload["ts"]), events)})
        if req.op == "stats":
            tenant, operator = str(payload.get("tenant", "")), bool(payload.get("operator"))
            decided = payload.get("tool_events") or {}  # the HTTP process's counts of skipped and refused events
            return _reply(req, True, cache.stats(tenant, operator, Page.of(payload), decided))
        if req.op == "workflow":
            return _reply(req, True, workflow_view(cache, _key(payload)))
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
