"""Who a request acts for: its tenant (workflow ids are scoped per tenant), and whether it is the operator.

Tenants are isolated by credentials. With a keys file (``--agentcache-api-keys-file``, ``agentcache serve
--api-keys-file``), each tenant has a key of its own, and the server's key (``--api-key``, or the file's
``operator`` entry) is the operator's, who sees every tenant. A request is the tenant whose key it carries,
whatever it says: the ``x-agentcache-tenant`` header only labels a sub-tenant inside that tenant's own
namespace. Without a keys file the server's key (or, on a keyless server, nobody) is the only credential:
every client is the operator. A keyless server is a development mode, and says so at start.

Tenant strings: ``<principal>`` or ``<principal>/<label>`` (agentcache.tags.principal_of), the principal being
the keys file's tenant name, or "" for the operator.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from agentcache.server_ext.config import ConfigError
from agentcache.tags import AGENT_SCOPE_SEP, MAX_ID_CHARS, TENANT_LABEL_SEP

logger = logging.getLogger("agentcache")

TENANT_HEADER = "x-agentcache-tenant"
# The same, under a name sglang-router forwards (it passes x-request-id-* and drops other headers).
ROUTED_TENANT_HEADER = "x-request-id-agentcache-tenant"
OPERATOR = "operator"  # the keys file's name for the operator's key
# Where the key middleware writes the principal of a request that carried a tenant's key (no client can set it).
PRINCIPAL_SCOPE_KEY = "agentcache.principal"
TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MIN_KEY_CHARS = 8
# What a tenant's key reaches: inference and the agentcache routes (health and metrics are open to all, as in
# SGLang). Every other route (flush, abort, weights, profiling, server info) needs the operator's key.
TENANT_PATHS = frozenset(
    (
        "/generate",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
        "/model_info",
        "/get_model_info",
        "/tokenize",
        "/detokenize",
        "/v1/tokenize",
        "/v1/detokenize",
    )
)
TENANT_PATH_PREFIXES = ("/agentcache/v1/", "/v1/models/")


def _digest(key: str) -> bytes:
    # Compared as digests: equal lengths, so the comparison's time says nothing about a key's length either.
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class TenantKeys:
    """The keys file, read: each tenant's key, and the operator's (None: the server's --api-key is)."""

    path: str
    tenants: dict[str, str] = field(default_factory=dict)  # name -> key
    operator: str | None = None
    _digests: tuple[tuple[str, bytes], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_digests", tuple((name, _digest(key)) for name, key in self.tenants.items()))

    def holder(self, presented: str) -> str | None:
        """The tenant whose key `presented` is; None for any other (the operator's, or none). Constant time in
        the key: every tenant's digest is compared, whichever matches."""
        digest = _digest(presented)
        found = None
        for name, expected in self._digests:
            if secrets.compare_digest(digest, expected):
                found = name
        return found


def load_keys(path: str, flag: str = "AGENTCACHE_API_KEYS_FILE") -> TenantKeys:
    """A keys file: one `name: key` a line, `#` comments and blank lines ignored; the name `operator` is the
    operator's key. Raises ConfigError naming the file, the line and what is wrong (`flag`: how it was given)."""
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{flag}={path!r}: {exc}") from None
    tenants: dict[str, str] = {}
    operator = None
    seen: dict[str, str] = {}  # key -> the name that has it
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{path}:{number}"
        name, colon, key = (part.strip() for part in text.partition(":"))
        if not colon:
            raise ConfigError(f"{where}: expected `name: key`, got a line without ':'")
        if not TENANT_NAME.fullmatch(name):
            raise ConfigError(
                f"{where}: tenant name {name!r} must be 1-64 letters, digits, '_', '.' or '-' (no '/'),"
                " starting with a letter or digit"
            )
        if len(key) < MIN_KEY_CHARS or not key.isprintable() or any(c.isspace() for c in key) or not key.isascii():
            raise ConfigError(
                f"{where}: {name}'s key must be at least {MIN_KEY_CHARS} printable ASCII characters without spaces"
            )
        if name in tenants or (name == OPERATOR and operator is not None):
            raise ConfigError(f"{where}: {name!r} is named twice")
        if key in seen:
            raise ConfigError(f"{where}: {name}'s key is {seen[key]}'s too: every tenant needs a key of its own")
        seen[key] = name
        if name == OPERATOR:
            operator = key
        else:
            tenants[name] = key
    return TenantKeys(path, tenants, operator)


def checked_operator_key(keys: TenantKeys, api_key: str | None, api_key_flag: str = "--api-key") -> str:
    """The operator's key of a server with a keys file: --api-key, or the file's `operator` entry (the same
    one where both are given). ConfigError where there is none, or two, or a tenant holds it."""
    if keys.operator is not None and api_key is not None and keys.operator != api_key:
        raise ConfigError(f"{keys.path}: its operator key differs from {api_key_flag}: give the operator's key once")
    operator = keys.operator if keys.operator is not None else api_key
    if not operator:
        raise ConfigError(
            f"{keys.path}: a keys file needs an operator key: an `{OPERATOR}: KEY` line or {api_key_flag}"
        )
    if keys.holder(operator) is not None:
        raise ConfigError(f"{keys.path}: the operator's key is also {keys.holder(operator)}'s")
    return operator


_keys: TenantKeys | None = None  # the HTTP process's keys file, once read (configure_keys)


def configure_keys(keys: TenantKeys | None) -> None:
    global _keys
    _keys = keys


def log_mode(api_key: str | None, keys: TenantKeys | None) -> None:
    """Say at start how tenants are told apart; a keyless server is a development mode."""
    if keys is not None:
        logger.info(
            "agentcache: %d tenant keys from %s; the server's key is the operator's", len(keys.tenants), keys.path
        )
    elif api_key:
        logger.info(
            "agentcache: one API key: every client holding it is the operator (x-agentcache-tenant labels"
            " sub-tenants; tenant keys: --agentcache-api-keys-file)"
        )
    else:
        logger.warning(
            "agentcache: DEVELOPMENT MODE: no API key. Every client is the operator and may read and end every"
            " workflow; x-agentcache-tenant is a label, not a boundary. Set --api-key, and a keys file for tenants"
        )


def _bearer(authorization: str | None) -> str:
    auth = authorization or ""
    return auth[7:] if auth[:7].lower() == "bearer " else ""


def is_tenant_path(path: str) -> bool:
    return path in TENANT_PATHS or path.startswith(TENANT_PATH_PREFIXES)


def add_key_middleware(original: Any, app: Any, *, api_key: str | None, admin_api_key: str | None) -> Any:
    """AROUND hook on SGLang's add_api_key_middleware: with a keys file, a tenant's key also opens the tenant
    routes (and marks the request as that tenant's); every other request is decided as SGLang decides."""
    keys = _keys
    if keys is None:
        return original(app, api_key=api_key, admin_api_key=admin_api_key)
    app.add_middleware(TenantKeyMiddleware, keys=keys, api_key=api_key, admin_api_key=admin_api_key, fastapi_app=app)
    return None


class TenantKeyMiddleware:
    """SGLang's API-key check with the keys file's tenant keys besides (ASGI, so disconnects reach the app)."""

    def __init__(self, app: Any, *, keys: TenantKeys, api_key: str | None, admin_api_key: str | None, fastapi_app: Any):
        self.app, self.keys, self.fastapi_app = app, keys, fastapi_app
        self.api_key, self.admin_api_key = api_key, admin_api_key

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from fastapi.responses import ORJSONResponse
        from sglang.srt.utils.auth import _get_auth_level_from_app_and_scope, decide_request_auth
        from starlette.datastructures import Headers

        authorization = Headers(scope=scope).get("authorization")
        holder = self.keys.holder(_bearer(authorization))
        path = scope.get("path", "")
        if holder is not None and is_tenant_path(path):
            scope[PRINCIPAL_SCOPE_KEY] = holder
            await self.app(scope, receive, send)
            return
        decision = decide_request_auth(
            method=scope.get("method", ""),
            path=path,
            authorization_header=authorization,
            api_key=self.api_key,
            admin_api_key=self.admin_api_key,
            auth_level=_get_auth_level_from_app_and_scope(self.fastapi_app, scope),
        )
        if decision.allowed:
            await self.app(scope, receive, send)
            return
        if holder is not None:
            body, status = {"error": f"Forbidden: {path} needs the operator's key, not a tenant's"}, 403
        else:
            body = {"error": "Unauthorized" if decision.error_status_code == 401 else "Forbidden"}
            status = decision.error_status_code
        await ORJSONResponse(body, status_code=status)(scope, receive, send)


def _label(headers: Any) -> str:
    return (headers.get(TENANT_HEADER) or headers.get(ROUTED_TENANT_HEADER) or "")[:MAX_ID_CHARS]


def tenant_of_request(request: Any) -> str:
    """The tenant a request acts for: workflow ids are scoped per tenant.

    The principal is the tenant whose key the request carried (set by the key middleware, never by a client),
    or "" for the operator (the server's key; everyone on a keyless server). The `x-agentcache-tenant` header
    (or `x-request-id-agentcache-tenant`, which sglang-router forwards) labels a sub-tenant inside that
    principal's namespace: "<principal>/<label>". No tenant key, no label: the operator's tenant "".
    """
    if request is None:
        return ""
    principal = getattr(request, "scope", {}).get(PRINCIPAL_SCOPE_KEY, "")
    label = _label(request.headers)
    return f"{principal}{TENANT_LABEL_SEP}{label}" if label else principal


def is_operator(request: Any) -> bool:
    """Whether a request acts for the server's operator: it presents the server's own key (not a tenant's) and
    names no sub-tenant. On a keyless server anyone is, short of naming a sub-tenant (nothing is protected)."""
    from sglang.srt.runtime_context import get_serving

    if getattr(request, "scope", {}).get(PRINCIPAL_SCOPE_KEY) is not None or _label(request.headers):
        return False
    serving = get_serving()
    keys = [k for k in (serving.admin_api_key, serving.api_key) if k]
    if not keys:
        return True
    presented = _bearer(request.headers.get("authorization"))
    return any(secrets.compare_digest(presented.encode(), k.encode()) for k in keys)


def salt_per_tenant() -> bool:
    from agentcache.server_ext.config import SALT_PER_TENANT_ENV

    return os.environ.get(SALT_PER_TENANT_ENV) == "1"


def salt_prefix_cache(obj: Any, request: Any) -> None:
    """Put a keyed tenant's prompts in a radix namespace of their own (SGLang's `extra_key`, kept with the
    client's own): its `cached_tokens` then never tell whether another tenant sent a prefix. The operator's
    prompts keep theirs."""
    principal = getattr(request, "scope", {}).get(PRINCIPAL_SCOPE_KEY) if request is not None else None
    if not principal:
        return
    salt = f"{principal}{AGENT_SCOPE_SEP}"
    extra = obj.extra_key
    if isinstance(extra, list):
        obj.extra_key = [salt + (e if isinstance(e, str) else "") for e in extra]
    else:
        obj.extra_key = salt + (extra if isinstance(extra, str) else "")
