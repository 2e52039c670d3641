"""The tags of an LLM request from the SDK to the policy, and their wire format (version 1).

A client puts them in the request body's ``custom_params`` (``/v1/chat/completions``
top level; ``/generate`` under ``sampling_params``) under one key, or, behind a
proxy that drops body fields, in the header :data:`HEADER`:

    "custom_params": {"agentcache": {"v": 1, "workflow": "wf-42", "agent": "a:3f9c...",
                                     "agent_name": "coder", "fixed_messages": 2}}

The object is flat (one level of scalars) because SGLang's msgpack IPC mode
cannot carry nested containers inside ``custom_params``. The forms the tags
take on their way (docs/architecture.md):

- the SDK builds :class:`Tags` and writes them with :meth:`Tags.to_wire`;
- the server's HTTP process reads the client's object with the one parser,
  :func:`parse` (of :func:`header_object` for the header), resolves the
  fixed-prompt boundary to tokens, and hands the scheduler one
  :class:`Stamped` per request: the tags with the tenant and the server's
  clock, the implicit tags it made for a request without any, or the reason it
  refused them (:meth:`Stamped.to_wire`, read back with :meth:`Stamped.from_wire`);
- the scheduler hands the policy the stamped :class:`Tags`, its boundary a
  page-aligned token offset (agentcache.engine.fixed_prompt).

Full reference: docs/design/wire-format.md.

An agent is known by the name users know (the framework's node, agent or role
name, ``agent_name``) wherever the SDK knows one, and by the fingerprint of its
fixed prompt (``agent``) otherwise: :attr:`Tags.identity`. The recorder, call
graphs, trained models and the live server all use that identity.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

KEY = "agentcache"
VERSION = 1
MAX_ID_CHARS = 256
MAX_FIXED = 1 << 24

# Header carrying the same tags where a proxy drops body fields (sglang-router forwards x-request-id-*).
HEADER = "x-request-id-agentcache"

_CLIENT_FIELDS = ("workflow", "agent", "agent_name", "fixed_messages", "fixed_tokens", "fixed_chars", "app")


# Tenants are "<principal>" or "<principal>/<label>": the principal is who holds the request's key (a keys file's
# tenant name, or "" for the operator and on a keyless server), the label a sub-tenant the holder names.
TENANT_LABEL_SEP = "/"
# Between a principal and an agent name in a scoped agent identity: not printable, so no client's name holds it.
AGENT_SCOPE_SEP = "\x1f"


def principal_of(tenant: str) -> str:
    """Who holds the credentials of `tenant` ("" for the operator): the unit of per-tenant caps and of agent names."""
    return tenant.partition(TENANT_LABEL_SEP)[0]


def scoped_agent(principal: str, name: str) -> str:
    """An agent identity as the server keeps it: the name, scoped by its key's holder (unscoped for the operator's)."""
    return f"{principal}{AGENT_SCOPE_SEP}{name}" if principal else name


def split_agent(identity: str) -> tuple[str, str]:
    """(principal, name) of a scoped agent identity; ("", identity) for an unscoped one."""
    principal, sep, name = identity.partition(AGENT_SCOPE_SEP)
    return (principal, name) if sep else ("", identity)


class WorkflowKey(NamedTuple):
    """A workflow as the server knows it: the tenant that owns it and the id its client gave it.

    Ids are scoped per tenant, so one tenant can never read or end another's workflow.
    """

    tenant: str
    id: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.id}" if self.tenant else self.id


@dataclass(frozen=True, slots=True)
class Tags:
    """The tags of one request."""

    workflow: str
    agent: str  # the fingerprint of the agent's fixed prompt (a trace may use a name here)
    agent_name: str | None = None  # the framework's name for the agent, when the SDK knows it
    fixed_messages: int | None = None  # chat: how many leading messages (after tools) are the fixed prompt
    # Token offset of the fixed-prompt boundary (/generate ids; resolved by the HTTP process from messages or
    # characters; page-aligned within the prompt once the scheduler has it)
    fixed_tokens: int | None = None
    fixed_chars: int | None = None  # /generate with text: characters of the fixed prompt
    # The app the workflow belongs to (its plan and forecasts are per app): the SDK's decorated function's
    # qualified name unless the app names one; implicit tags have none.
    app: str | None = None
    # Set by the server, never taken from a client:
    tenant: str = ""  # from the request's credentials
    ts: float | None = None  # the HTTP process's clock when it accepted the request: the policy clock
    # The server made these tags for a request that came without any (no SDK): a workflow of its own,
    # which ends when the request does, the agent by the fingerprint rule below.
    implicit: bool = False
    # Derived, and read at every step the policy takes for the request: made once.
    key: WorkflowKey = field(init=False, repr=False, compare=False)  # the workflow as the server knows it
    # The agent as the policy, the forecasters and the recorder know it: its name, else its fingerprint; on the
    # server scoped by the principal of its tenant (scoped_agent), as the operator's and a replay's are not.
    identity: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", WorkflowKey(self.tenant, self.workflow))
        # Scoped by the key's holder, so no tenant's agent names reach another's forecasts.
        name = self.agent_name or self.agent
        object.__setattr__(self, "identity", scoped_agent(principal_of(self.tenant), name) if self.tenant else name)

    @property
    def app_identity(self) -> str | None:
        """The app as the policy knows it: its name, scoped by the principal of its tenant as `identity` is."""
        if self.app is None:
            return None
        return scoped_agent(principal_of(self.tenant), self.app) if self.tenant else self.app

    @property
    def fixed(self) -> int:
        """The fixed-prompt boundary in tokens (0: none known)."""
        return self.fixed_tokens or 0

    def to_wire(self) -> dict[str, Any]:
        """The client's object (no server-set fields)."""
        out: dict[str, Any] = {"v": VERSION}
        for name in _CLIENT_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def replace(self, **changes: Any) -> Tags:
        return replace(self, **changes)


class TagError(ValueError):
    """Tags that break the format. `reason` is a short stable code (for counters), the message says what."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def _id(obj: Mapping[str, Any], name: str, required: bool) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
    return check_id(name, value)


def check_id(name: str, value: Any) -> str:
    """`value` if it is a valid id for the tag field `name` (1-MAX_ID_CHARS printable characters), else TagError."""
    if not isinstance(value, str) or not value:
        raise TagError(f"bad_{name}", f"'{name}' must be a non-empty string, got {type(value).__name__}")
    if len(value) > MAX_ID_CHARS:
        raise TagError(f"bad_{name}", f"'{name}' is {len(value)} characters (at most {MAX_ID_CHARS})")
    if not value.isprintable():
        raise TagError(f"bad_{name}", f"'{name}' contains non-printable characters")
    return value


def _count(obj: Mapping[str, Any], name: str) -> int | None:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_FIXED:
        raise TagError(f"bad_{name}", f"'{name}' must be an integer in [0, {MAX_FIXED}], got {value!r}")
    return value


def parse(obj: Any) -> Tags:
    """Validate a client's wire object; raises TagError naming what is wrong. Server-set fields are ignored."""
    if not isinstance(obj, Mapping):
        raise TagError("not_an_object", f"tags must be a JSON object, got {type(obj).__name__}")
    version = obj.get("v")
    if version != VERSION or isinstance(version, bool):
        raise TagError("bad_version", f"unsupported tag version {version!r} (this server speaks {VERSION})")
    for key, value in obj.items():
        if isinstance(value, (dict, list, tuple)):
            raise TagError("nested", f"'{key}' is nested; tags are one flat level of scalars")
    return Tags(
        workflow=_id(obj, "workflow", True),  # type: ignore[arg-type]
        agent=_id(obj, "agent", True),  # type: ignore[arg-type]
        agent_name=_id(obj, "agent_name", False),
        fixed_messages=_count(obj, "fixed_messages"),
        fixed_tokens=_count(obj, "fixed_tokens"),
        fixed_chars=_count(obj, "fixed_chars"),
        app=_id(obj, "app", False),
    )


def header_object(text: str) -> Any:
    """The client's tag object sent in the :data:`HEADER` header (compact JSON), for :func:`parse`."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the decoder goes
        raise TagError("bad_header", f"the {HEADER} header is not JSON") from None


class Stamped(NamedTuple):
    """What the HTTP process hands the scheduler for one request: the tenant it came from and either its tags
    (the client's, or the implicit ones the server made for a request without any: ``tags.implicit``),
    stamped with the server's clock, or the reason it refused the client's (``reason``; both None: the
    request came without tags and the server made none). SGLang sends an ``n`` group (n > 1 samples of one
    prompt) to the scheduler as ``members`` requests with this one stamp, a prefill-only warm-up and the n
    samples: one logical call, named by ``call``, that the policy observes once."""

    tenant: str
    tags: Tags | None = None
    reason: str | None = None
    call: str | None = None
    members: int = 1

    def to_wire(self) -> dict[str, Any]:
        """The flat object SGLang carries to the scheduler in the request's custom_params."""
        if self.tags is None:
            stamped: dict[str, Any] = {"tenant": self.tenant, "invalid": self.reason}
        else:
            stamped = {**self.tags.to_wire(), "tenant": self.tenant, "ts": self.tags.ts}
            if self.tags.implicit:
                stamped["implicit"] = True
        if self.call is not None and self.members > 1:
            stamped["call"], stamped["members"] = self.call, self.members
        return stamped

    @staticmethod
    def from_wire(obj: Any) -> Stamped:
        """The scheduler's reading of :meth:`to_wire`. A request that did not pass the HTTP process's intake
        (none does, short of a bug) counts as refused with the reason its tags would have had."""
        if not isinstance(obj, Mapping):
            return Stamped("", None, "not_an_object" if obj is not None else None)
        tenant = obj.get("tenant") if isinstance(obj.get("tenant"), str) else ""
        call, members = obj.get("call"), obj.get("members")
        if not (isinstance(call, str) and isinstance(members, int) and not isinstance(members, bool) and members > 1):
            call, members = None, 1
        if "invalid" in obj:
            return Stamped(tenant, None, str(obj["invalid"]), call, members)
        try:
            tags = parse(obj)
        except TagError as exc:
            return Stamped(tenant, None, exc.reason, call, members)
        ts = obj.get("ts")
        ts = float(ts) if isinstance(ts, (int, float)) and not isinstance(ts, bool) and math.isfinite(ts) else None
        tags = replace(tags, tenant=tenant, ts=ts, implicit=obj.get("implicit") is True)
        return Stamped(tenant, tags, None, call, members)


def find(custom_params: Any) -> Any:
    """The raw tag object inside a request's custom_params, or None when untagged."""
    if isinstance(custom_params, Mapping):
        return custom_params.get(KEY)
    return None


# ---------------------------------------------------------------- the agent fingerprint rule
#
# An agent's fingerprint (docs/design/wire-format.md) is a digest of its fixed prefix: the leading system or
# developer messages and the tool schemas when the prompt starts with one (the fixed prompt is then
# exactly those messages); otherwise (AutoGen's selector, prompts built from one template) the role and
# the first FIRST_CHARS characters of the first message, plus the tools, with no fixed message. The SDK
# tags requests with it, and the server gives it to requests that came without tags.

FIRST_CHARS = 200
FIXED_ROLES = ("system", "developer")


def _content(message: Mapping[str, Any]) -> Any:
    return message.get("content")


def agent_of(messages: Sequence[Mapping[str, Any]], tools: Any = None) -> tuple[str, int]:
    """(agent id, number of leading fixed messages) for a chat prompt."""
    fixed = 0
    while fixed < len(messages) and isinstance(messages[fixed], Mapping) and messages[fixed].get("role") in FIXED_ROLES:
        fixed += 1
    if fixed:
        basis: Any = [[m.get("role"), _content(m)] for m in messages[:fixed]]
    elif messages and isinstance(messages[0], Mapping):
        first = messages[0]
        content = _content(first)
        head = (
            content[:FIRST_CHARS]
            if isinstance(content, str)
            else json.dumps(content, sort_keys=True, default=str)[:FIRST_CHARS]
        )
        basis = [first.get("role"), head]
    else:
        basis = []
    digest = hashlib.sha256(json.dumps([basis, tools or []], sort_keys=True, default=str).encode()).hexdigest()
    return f"a:{digest[:16]}", fixed
