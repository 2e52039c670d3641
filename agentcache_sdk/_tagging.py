"""The tags of a request made inside a workflow, and where they go in its body and headers.

Both request hooks use this (agentcache_sdk._hooks): the openai SDK's, on a request's options before its body is
made, and httpx's, on any request to the configured server as it is sent. Only requests to that server are
touched: no other endpoint ever sees the extra fields. Whatever fails inside tagging, the request goes out as the
app wrote it.

The routing key (``x-smg-routing-key``, read by sglang-router's manual
policy) is the workflow id (percent-encoded where it is not ASCII: a header
value must be), unless the server is an agentcache cluster and the routing
is ``workflow-aware`` (the default): then httpx's send, which every request
goes through (the openai SDK's too), replaces it with the slot
agentcache_sdk._routing chooses, and hands the answer back to it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

from agentcache.tags import HEADER, KEY, TagError, Tags, agent_of, find, parse
from agentcache_sdk import _plan, _routing, _tools
from agentcache_sdk._config import settings
from agentcache_sdk._counters import logger, warn_once
from agentcache_sdk._routing import Ticket
from agentcache_sdk._workflow import as_id, current_agent_name, current_workflow

ROUTING_HEADER = "x-smg-routing-key"  # sglang-router (manual policy) pins each key to one worker
_TAGGED_PATHS = ("/chat/completions", "/generate")


def tags_for(path: str, body: Mapping[str, Any]) -> Tags | None:
    """The tags of one request body inside the current workflow (None outside any, or for other routes)."""
    ctx = current_workflow()
    if ctx is None or not path.endswith(_TAGGED_PATHS):
        return None
    fixed_messages = None
    if path.endswith("/chat/completions"):
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        agent, fixed_messages = agent_of(messages, body.get("tools"))
    else:
        text = body.get("text")
        head = text[:200] if isinstance(text, str) else str(body.get("input_ids", ""))[:200]
        agent, _ = agent_of([{"role": "user", "content": head}])
    name = as_id(current_agent_name())  # a framework's node or role name, as the user wrote it
    workflow_id = ctx.tag_request(name or agent)  # after an end, the call's next workflow (see _workflow)
    if workflow_id is None:
        return None
    _tools.called_again(ctx, name or agent)  # the agent's tool pause, if one is open, is over
    return Tags(workflow=workflow_id, agent=agent, agent_name=name, fixed_messages=fixed_messages, app=ctx.app)


def routing_key(workflow: str) -> str:
    """The workflow's routing key: its id, percent-encoded where it is not ASCII (a workflow named in Chinese or
    Cyrillic is valid, a header value with it is not)."""
    return workflow if workflow.isascii() else quote(workflow, safe="")


def routing_headers(tags: Tags) -> dict[str, str]:
    wire = json.dumps(tags.to_wire(), ensure_ascii=True, separators=(",", ":"))
    return {ROUTING_HEADER: routing_key(tags.workflow), HEADER: wire}


def tags_in(body: Mapping[str, Any]) -> Any:
    """The tag object a body already carries (put there by the app, or by the openai hook), else None."""
    found = find(body.get("custom_params"))
    if found is None:
        params = body.get("sampling_params")
        found = find(params.get("custom_params")) if isinstance(params, Mapping) else None
    return found


def _with_tags(path: str, body: dict[str, Any], tags: Tags) -> dict[str, Any] | None:
    """The body with tags under custom_params (top level for OpenAI routes, sampling_params for /generate); None
    where the app's own field there is not an object (the request goes as the app wrote it, untagged: the
    server answers it as it would have)."""
    if path.endswith("/generate"):
        params = body.get("sampling_params")
        params = {} if params is None else params
        if not isinstance(params, Mapping):
            return None
        custom = _custom_params_with(params.get("custom_params"), tags)
        return None if custom is None else {**body, "sampling_params": {**params, "custom_params": custom}}
    custom = _custom_params_with(body.get("custom_params"), tags)
    return None if custom is None else {**body, "custom_params": custom}


def _custom_params_with(custom: Any, tags: Tags) -> dict[str, Any] | None:
    """An app's custom_params (None: it has none) with the tags added; None where they are not an object."""
    if custom is None:
        return {KEY: tags.to_wire()}
    return {**custom, KEY: tags.to_wire()} if isinstance(custom, Mapping) else None


def _tag_openai_options(client: Any, options: Any) -> None:
    body = options.json_data
    if not isinstance(body, Mapping) or tags_in(body) is not None:
        return
    if not settings.targets(str(client.base_url)):
        return
    tags = tags_for(options.url, body)
    if tags is None:
        return
    extra = dict(options.extra_json) if isinstance(options.extra_json, Mapping) else {}
    custom = _custom_params_with(extra.get("custom_params") or body.get("custom_params"), tags)
    if custom is None:
        return
    extra["custom_params"] = custom
    headers = dict(options.headers) if isinstance(options.headers, Mapping) else {}
    headers.update(routing_headers(tags))
    options.extra_json, options.headers = extra, headers  # all or nothing


def tag_openai_options_or_leave(client: Any, options: Any) -> None:
    try:
        _tag_openai_options(client, options)
    except Exception:  # a bug of ours must not fail the app's request: it goes as the app wrote it
        tagging_failed()


def tagging_failed() -> None:
    logger.debug("agentcache: tagging a request failed", exc_info=True)
    warn_once(
        "tagging_failures",
        "agentcache: tagging a request failed (a bug: please report it); the request was sent untagged, as the app"
        " wrote it; counted in agentcache_sdk.stats()['tagging_failures']",
    )


Retagged = tuple[httpx.Request, "dict[str, Any] | None", "Tags | None", "Ticket | None"]


def _retag(request: httpx.Request) -> Retagged:
    """(request to send, its JSON body, its tags, its routing ticket) for a request to the agentcache server.

    The ticket, when the request was routed workflow-aware, must be handed back (`Ticket.done`) once the
    answer is in or the request failed.
    """
    if (
        request.method != "POST"
        or not settings.targets(str(request.url))
        or not request.url.path.endswith(_TAGGED_PATHS)
    ):
        return request, None, None, None
    try:
        body = json.loads(request.content or b"null")
    except (ValueError, httpx.RequestNotRead):
        return request, None, None, None
    if not isinstance(body, dict):
        return request, None, None, None
    ctx = current_workflow()
    authorization = request.headers.get("authorization")
    if ctx is not None and authorization:
        ctx.authorization = authorization
    carried = tags_in(body)
    if carried is not None:  # tagged by the openai hook (or by the app itself): read back with the one parser
        try:
            tags = parse(carried)
        except TagError:
            return request, body, None, None
        ticket = None
        if ctx is not None and ctx.id == tags.workflow:
            _plan.requested(ctx)  # its app's plan goes before its first request
        # Route the SDK's own workflows (the openai hook set the workflow id as the key); an app's own tags
        # and routing keys are left as they are.
        if (
            ctx is not None
            and ctx.id == tags.workflow
            and request.headers.get(ROUTING_HEADER) in (None, routing_key(tags.workflow))
        ):
            ticket = _routing.route(request.url.path, body, tags, authorization)
            if ticket is not None:
                request.headers[ROUTING_HEADER] = ticket.key
        return request, body, tags, ticket
    tags = tags_for(request.url.path, body)
    if tags is None:
        return request, body, None, None
    tagged_body = _with_tags(request.url.path, body, tags)
    if tagged_body is None:
        return request, body, None, None
    body = tagged_body
    if ctx is not None:
        _plan.requested(ctx)  # its app's plan goes before its first request
    headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
    headers.update(routing_headers(tags))
    tagged = httpx.Request(
        request.method, request.url, headers=headers, content=json.dumps(body).encode(), extensions=request.extensions
    )
    # Routed last: a ticket is handed back only once the request was sent, so nothing may fail after it is taken.
    ticket = _routing.route(request.url.path, body, tags, authorization)
    if ticket is not None:
        tagged.headers[ROUTING_HEADER] = ticket.key
    return tagged, body, tags, ticket


def retag_or_leave(request: httpx.Request) -> Retagged:
    try:
        return _retag(request)
    except Exception:  # a bug of ours must not fail the app's request: it goes as the app wrote it
        tagging_failed()
        return request, None, None, None
