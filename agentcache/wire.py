"""The agentcache tag wire format, version 1: what a client puts on a request, and its validation.

Tags travel in the request body's ``custom_params`` (``/v1/chat/completions``
top level; ``/generate`` under ``sampling_params``) under one key:

    "custom_params": {"agentcache": {"v": 1, "workflow": "wf-42", "agent": "a:3f9c...",
                                     "agent_name": "coder", "fixed_messages": 2}}

The object is flat (one level of scalars) because SGLang's msgpack IPC mode
cannot carry nested containers inside ``custom_params``. Full reference:
docs/wire-format.md. Both the SDK (which writes tags) and the server plugin
(which reads them) use this module, so the two cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

KEY = "agentcache"
VERSION = 1
MAX_ID_CHARS = 256
MAX_FIXED = 1 << 24

# Header carrying the same tags where a proxy drops body fields (sglang-router forwards x-request-id-*).
HEADER = "x-request-id-agentcache"


class Tags(NamedTuple):
    """Validated tags of one request."""

    workflow: str
    agent: str
    agent_name: str | None = None
    fixed_messages: int | None = None  # chat: how many leading messages (after tools) are the fixed prompt
    fixed_tokens: int | None = None  # token offset of the fixed-prompt boundary (server-resolved, or /generate ids)
    fixed_chars: int | None = None  # /generate with text: characters of the fixed prompt

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": VERSION, "workflow": self.workflow, "agent": self.agent}
        for name in ("agent_name", "fixed_messages", "fixed_tokens", "fixed_chars"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


class TagError(ValueError):
    """Tags that break the format. `reason` is a short stable code (for counters), the message says what."""

    def __init__(self, reason: str, message: str):
        self.reason = reason
        super().__init__(message)


def _id(obj: Mapping[str, Any], name: str, required: bool) -> str | None:
    value = obj.get(name)
    if value is None and not required:
        return None
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
    """Validate a wire object; raises TagError naming what is wrong."""
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
    )


def find(custom_params: Any) -> Any:
    """The raw tag object inside a request's custom_params, or None when untagged."""
    if isinstance(custom_params, Mapping):
        return custom_params.get(KEY)
    return None
