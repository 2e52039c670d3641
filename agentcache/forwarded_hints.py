"""Other clients' session and agent hints, carried past sglang-router in one header it forwards.

sglang-router (0.3.2) forwards to a worker only ``authorization``, ``x-smg-routing-key``, ``x-request-id``,
``traceparent`` and the ``x-request-id-*`` headers, and rebuilds the body of ``/generate`` and
``/v1/chat/completions`` from its own request types, dropping ``session_id``, ``agent_hints``, ``nvext`` and the
rest. The front of `agentcache serve --workers N` (server_ext/front.py) therefore packs the headers and body
fields a client's hints ride in, unchanged, into :data:`HEADER`; a worker's intake merges them back
(:func:`with_forwarded`) and reads them with the one reader, agentcache/client_hints.py, as if the client had
sent them to it directly.

Plain Python, no SGLang import: the worker's HTTP process and the front both import it.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

HEADER = "x-request-id-agentcache-client"
ROUTING_HEADER = "x-smg-routing-key"  # the front sets it from the hints; a client's own comes packed
MAX_CHARS = 8192  # of the packed header: well inside every hop's header limits (uvicorn's h11: 16 KiB in all)


def pack(
    headers: Mapping[str, str],
    body: Mapping[str, Any] | None,
    header_names: Collection[str],
    body_fields: Collection[str],
) -> str | None:
    """The value of :data:`HEADER` for a request: its headers named in `header_names` (lowercase) and its
    top-level body fields named in `body_fields`, as compact ASCII JSON ``{"headers": {...}, "body": {...}}``;
    None where it has none. A field whose value would take the header past MAX_CHARS is left out (the reader
    refuses values that large anyway), so the request goes on without it."""
    carried_headers = {k.lower(): v for k, v in headers.items() if k.lower() in header_names}
    carried_body = {k: body[k] for k in body_fields if k in body} if isinstance(body, Mapping) else {}
    if not carried_headers and not carried_body:
        return None
    packed = {"headers": carried_headers, "body": carried_body}
    text = _dumps(packed)
    for field in sorted(carried_body, key=lambda k: -len(_dumps(carried_body[k]))):
        if len(text) <= MAX_CHARS:
            break
        del carried_body[field]
        text = _dumps(packed)
    for name in sorted(carried_headers, key=lambda k: -len(carried_headers[k])):
        if len(text) <= MAX_CHARS:
            break
        del carried_headers[name]
        text = _dumps(packed)
    return text if carried_headers or carried_body else None


def unpack(value: str | None) -> tuple[dict[str, str], dict[str, Any]]:
    """(headers, body fields) from a :data:`HEADER` value; nothing from a missing or malformed one (a header a
    client made up carries no more than the hints it could send directly)."""
    if not value or len(value) > MAX_CHARS:
        return {}, {}
    try:
        packed = json.loads(value)
    except ValueError:
        return {}, {}
    if not isinstance(packed, dict):
        return {}, {}
    headers, body = packed.get("headers"), packed.get("body")
    headers = {k: v for k, v in headers.items() if isinstance(v, str)} if isinstance(headers, dict) else {}
    return headers, body if isinstance(body, dict) else {}


def with_forwarded(headers: Mapping[str, str], body: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """A request's headers (lower-case names) and body as its client sent them to the front, for the reader: the
    packed ones merged in where :data:`HEADER` came. The routing key it came with is then the front's (set from
    these very hints), not the client's, which came packed if it sent one."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    body = dict(body) if isinstance(body, Mapping) else {}  # a body that is no JSON object carries no fields
    value = lowered.pop(HEADER, None)
    if value is None:
        return lowered, body
    lowered.pop(ROUTING_HEADER, None)
    more_headers, more_body = unpack(value)
    return {**lowered, **more_headers}, {**more_body, **body}


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True)
