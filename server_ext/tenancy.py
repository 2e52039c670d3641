"""Who a request acts for: its tenant (workflow ids are scoped per tenant), and whether it is the operator."""

from __future__ import annotations

import hashlib
from typing import Any

from agentcache.tags import MAX_ID_CHARS

TENANT_HEADER = "x-agentcache-tenant"
# The same, under a name sglang-router forwards (it passes x-request-id-* and drops other headers).
ROUTED_TENANT_HEADER = "x-request-id-agentcache-tenant"


def tenant_of_request(request: Any) -> str:
    """The tenant a request acts for: workflow ids are scoped per tenant.

    It is a digest of the bearer key the client presents (so a tenant with its
    own key cannot be impersonated without that key), followed by the
    `x-agentcache-tenant` header (or `x-request-id-agentcache-tenant`, which
    sglang-router forwards) when present (sub-tenants of one shared key:
    the server's --api-key vouches for whoever holds it). No key, no header:
    the anonymous tenant "".
    """
    if request is None:
        return ""
    headers = request.headers
    auth = headers.get("authorization", "")
    key = auth[7:] if auth[:7].lower() == "bearer " else ""
    sub = (headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER) or "")[:MAX_ID_CHARS]
    if not key and not sub:
        return ""
    digest = hashlib.sha256(key.encode()).hexdigest()[:12] if key else ""
    return f"{digest}/{sub}"


def is_operator(request: Any) -> bool:
    """Whether a request acts for the server's operator: it presents the server's own key and names no
    sub-tenant. On a server without a key anyone is, short of naming a sub-tenant (nothing is protected)."""
    import secrets

    from sglang.srt.runtime_context import get_serving

    headers = request.headers
    if headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER):
        return False
    serving = get_serving()
    keys = [k for k in (serving.admin_api_key, serving.api_key) if k]
    if not keys:
        return True
    auth = headers.get("authorization", "")
    presented = auth[7:] if auth[:7].lower() == "bearer " else ""
    return any(secrets.compare_digest(presented.encode(), k.encode()) for k in keys)
