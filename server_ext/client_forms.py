"""What other clients' session and agent forms become on the server (agentcache/client_hints.py reads them).

The intake (server_ext/intake.py) asks here for a request that came without our tags: the workflow its forms name
(scoped to the tenant as our tags are), the agent by the form's agent id where it gives one (else by the
fingerprint rule, as for an untagged request), or the reason its forms were refused (served untagged, counted as
bad tags are). Once the request is answered, what its forms say is done through the control channel, as the
events route does it (server_ext/routes.py):

- a final marker (``x-dynamo-session-final``, ``nvext.agent_context.session_final``) ends the workflow; on a
  subagent's session, it ends that agent instead (``agent_done``);
- ``reuse_hint: "evict"`` says the agent's context will not be read again (``agent_done``);
- a ``tool_name`` starts a tool pause (``tool_start``): the step's answer calls that tool; the pause ends with
  the agent's next call, or is cut off as any pause is. The expected duration is read and checked, not used:
  the policy learns each tool's durations itself.

SGLang's ``POST /close_session`` ends the workflow of the same id too, after SGLang closed its own session
(:func:`around_close_session`). SGLang's request models drop the fields it does not know (``agent_hints``,
``nvext``, ``prompt_cache_key``): they are read from the body as FastAPI parsed it, which Starlette keeps on the
request (behind `agentcache serve --workers N`, which drops them, in the header agentcache/forwarded_hints.py
packs them into).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agentcache.client_hints import ClientHints, read_client_hints
from agentcache.forwarded_hints import with_forwarded
from agentcache.server_ext.control import ControlError, control, server_clock
from agentcache.server_ext.tenancy import tenant_of_request
from agentcache.tags import Stamped, TagError, Tags, check_id

logger = logging.getLogger("agentcache")

HINTS_SCOPE_KEY = "agentcache.client_hints"  # a request's hints, read once for all of its hooks
_sending: set[asyncio.Task] = set()  # follow-ups under way (the loop keeps weak references to tasks only)


def hints_of(request: Any) -> ClientHints | None:
    """The hints a request's other forms carry (read once per request); None without a request or any form."""
    scope = getattr(request, "scope", None)
    if not isinstance(scope, dict):
        return None
    if HINTS_SCOPE_KEY not in scope:
        # Starlette keeps the JSON body FastAPI parsed (`Request.json` caches it): the fields SGLang's models drop.
        # Behind `agentcache serve --workers N` they come packed in one header the router forwards.
        try:
            headers, body = with_forwarded(request.headers, getattr(request, "_json", None))
            scope[HINTS_SCOPE_KEY] = read_client_hints(headers, body)
        except Exception:  # never an error for the app: served as if it sent no forms
            logger.exception("agentcache: reading a client's session hints failed; the request goes on without")
            scope[HINTS_SCOPE_KEY] = None
    return scope[HINTS_SCOPE_KEY]


def hinted(tenant: str, hints: ClientHints | None, agent: str, fixed_tokens: int | None) -> Stamped | None:
    """Tags from a request's forms (`agent`: its fingerprint), or their refusal; None where they name no workflow
    and refused nothing (the request gets implicit tags)."""
    if hints is None:
        return None
    if hints.workflow is None:
        return Stamped(tenant, None, hints.refused[0]) if hints.refused else None
    tags = Tags(
        workflow=hints.workflow, agent=agent, agent_name=hints.agent, fixed_tokens=fixed_tokens or None, app=hints.app
    )
    return Stamped(tenant, tags)


def follow_ups(hints: ClientHints | None, stamps: list[Stamped]) -> list[tuple[str, dict[str, Any]]]:
    """The control operations a request's hints ask for once it is answered, for each workflow and agent its
    prompts were tagged with (our tags or the forms'; implicit ones have nothing to end)."""
    if hints is None or not (hints.final or hints.tool or hints.reuse_hint == "evict"):
        return []
    ops: list[tuple[str, dict[str, Any]]] = []
    seen = set()
    for stamped in stamps:
        tags = stamped.tags
        if tags is None or tags.implicit:
            continue
        agent = tags.agent_name or tags.agent
        if (stamped.tenant, tags.workflow, agent) in seen:
            continue
        seen.add((stamped.tenant, tags.workflow, agent))
        events = []
        if hints.tool:
            events.append(["tool_start", tags.workflow, agent, hints.tool])
        if hints.reuse_hint == "evict" or (hints.final and hints.subagent):
            events.append(["agent_done", tags.workflow, agent])
        if events:
            ops.append(("tool_events", {"tenant": stamped.tenant, "events": events}))
        if hints.final and not hints.subagent:
            ops.append(("end", {"tenant": stamped.tenant, "workflow": tags.workflow}))
    return ops


async def send(ops: list[tuple[str, dict[str, Any]]]) -> None:
    """The operations to every scheduler, in order, each stamped with the server's clock as it goes."""
    for op, payload in ops:
        try:
            await control(op, {**payload, "ts": server_clock()})
        except ControlError as exc:
            logger.warning("agentcache: a client's %s was not applied: %s", op, exc)


def send_later(ops: list[tuple[str, dict[str, Any]]]) -> None:
    """:func:`send` on a task of its own (a request cancelled or closed early must not lose its end)."""
    task = asyncio.get_running_loop().create_task(send(ops))
    _sending.add(task)
    task.add_done_callback(_sending.discard)


def around_close_session(original: Any, tokenizer_manager: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND hook on TokenizerManager.close_session (SGLang's ``POST /close_session``): SGLang closes its own
    session as ever, then the workflow of the same id, the tenant's, ends."""
    request = args[0] if args else kwargs.get("request")
    return _close_session(original(tokenizer_manager, obj, *args, **kwargs), obj, request)


async def _close_session(closing: Any, obj: Any, request: Any) -> Any:
    try:
        return await closing
    finally:
        try:
            session = check_id("workflow", getattr(obj, "session_id", None))
        except TagError:
            session = None
        if session is not None:
            await send([("end", {"tenant": tenant_of_request(request), "workflow": session})])
