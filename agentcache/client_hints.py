"""Other agent stacks' session and agent hints, read into one :class:`ClientHints` (no SGLang import).

Clients without our SDK often say already which session and agent a request belongs to, each stack in its own
form. One parser per form below, with the field names as the projects' own code spells them (SGLang's protocol
and RFC #24656 / PR #24993's ``agent_hints``; Dynamo's ``lib/llm/src/protocols/agents.rs`` and
``common/extensions.rs``; sglang-router's ``x-smg-routing-key``; OpenAI's ``prompt_cache_key``).
docs/design/wire-format.md ("Other clients' forms") has the table of every form and what it becomes.

One precedence order where a request carries several (:data:`PRECEDENCE`; our own tags come before all of
them, in the intake); per-user keys last, since they may name a user rather than a session. The first valid
form names the workflow; hint-only fields (an ``agent_hints`` object without a ``workflow_id``,
``nvext.agent_hints``, the ``x-dynamo-session-final`` header) apply to the workflow the request rides with.

A subagent's session (one naming a parent session) becomes an agent of its parent's workflow, as our SDK tags a
framework's subagents: its workflow is the parent session, its agent the child session (or the form's agent
id), and a final marker on it ends that agent (agent done), not the workflow.

A form with a bad value (a wrong type, an id over 256 characters or with unprintable characters, an unknown
``reuse_hint``) gives nothing, and its reason (``bad_hint_<form>``) comes back to be counted; the request never
fails for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from agentcache.tags import HEADER, TagError, check_id, find, header_object

REUSE_HINTS = ("keep", "offload", "evict")
MAX_CHILDREN = 256
MAX_DURATION_MS = 7 * 24 * 3600 * 1000  # a week: past that, a duration is a mistake, not a hint
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

# The forms naming a workflow, most trusted first (per-user keys last).
PRECEDENCE = (
    "sglang_agent_hints",
    "sglang_session_id",
    "nvext_agent_context",
    "dynamo_headers",
    "claude_code",
    "codex",
    "x_session_id",
    "smg_routing_key",
    "prompt_cache_key",
)
PER_USER = frozenset(("smg_routing_key", "prompt_cache_key"))


@dataclass(frozen=True, slots=True)
class ClientHints:
    """What a request's other forms say: the workflow it belongs to and what to do with it.

    `workflow` is None where no valid form named one (then `refused` says why, or only hints came)."""

    form: str | None = None  # the form that named the workflow (PRECEDENCE)
    workflow: str | None = None  # our workflow: the session, or a subagent's parent session
    agent: str | None = None  # the agent's name: the form's agent id, or a subagent's own session
    parent: str | None = None  # the parent session a subagent's session named (then `workflow` is it)
    subagent: bool = False  # the session the request names is an agent's within `workflow`, not the workflow
    final: bool = False  # the request's session ends with it (a workflow's end, or a subagent's: agent done)
    tool: str | None = None  # the tool the step calls once this request is answered
    tool_seconds: float | None = None  # how long the client expects that tool to take
    reuse_hint: str | None = None  # keep / offload / evict: `evict` says the agent's context is done
    app: str | None = None  # older Dynamo's workflow_type_id: what kind of workflow
    parent_agent: str | None = None  # the agent that started this one, inside the same workflow
    priority: int | None = None  # nvext.agent_hints: checked, not used by a policy
    osl: int | None = None  # nvext.agent_hints: expected output tokens; checked, not used by a policy
    refused: tuple[str, ...] = ()  # reasons of forms left out for bad values, in precedence order
    per_user: bool = False  # the workflow is a per-user key's (prompt_cache_key, a routing key)


class HintError(ValueError):
    """One form's bad value; `reason` (``bad_hint_<form>``) is what is counted."""

    def __init__(self, form: str, message: str):
        self.reason = f"bad_hint_{form}"
        super().__init__(f"{form}: {message}")


# ---------------------------------------------------------------- values


def _id(form: str, field: str, value: Any) -> str | None:
    if value is None:
        return None
    try:
        return check_id(field, value)
    except TagError as exc:
        raise HintError(form, str(exc)) from None


def _header(form: str, headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    return _id(form, name, value) if value else None  # an empty header says nothing (as Dynamo reads it)


def _object(form: str, field: str, value: Any) -> Mapping[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise HintError(form, f"'{field}' must be an object, got {type(value).__name__}")
    return value


def _count(form: str, field: str, value: Any, low: int = 0, high: int = 1 << 31) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise HintError(form, f"'{field}' must be an integer in [{low}, {high}], got {value!r}")
    return value


def _millis(form: str, field: str, value: Any) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 <= value <= MAX_DURATION_MS
    ):
        raise HintError(form, f"'{field}' must be a number of milliseconds in [0, {MAX_DURATION_MS}], got {value!r}")
    return float(value)


def _flag(form: str, field: str, value: Any) -> bool | None:
    """A JSON boolean, or a header's true/false words (as Dynamo's parse_bool_opt reads them)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise HintError(form, f"'{field}' must be true or false, got {value!r}")


def _session(form: str, session: str, parent: str | None, agent: str | None = None) -> ClientHints:
    """A session form's reading: a subagent's session (one naming a parent) is an agent of the parent's workflow."""
    if parent is not None and parent != session:
        return ClientHints(form, workflow=parent, agent=agent or session, parent=parent, subagent=True)
    return ClientHints(form, workflow=session, agent=agent)


# ---------------------------------------------------------------- one parser per form


def sglang_agent_hints(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "sglang_agent_hints"
    hints = _object(form, "agent_hints", body.get("agent_hints"))
    if hints is None:
        return None
    for field in ("step_id", "parent_step_id", "shared_prefix_hash"):
        _id(form, field, hints.get(field))
    _count(form, "step_index", hints.get("step_index"))
    _count(form, "total_steps", hints.get("total_steps"))
    children = hints.get("children_step_ids")
    if children is not None:
        if not isinstance(children, list) or len(children) > MAX_CHILDREN:
            raise HintError(form, f"'children_step_ids' must be a list of at most {MAX_CHILDREN} step ids")
        for child in children:
            _id(form, "children_step_ids", child)
    _millis(form, "cache_ttl_ms", hints.get("cache_ttl_ms"))
    reuse = hints.get("reuse_hint")
    if reuse is not None and reuse not in REUSE_HINTS:
        raise HintError(form, f"'reuse_hint' must be one of {', '.join(REUSE_HINTS)}, got {reuse!r}")
    tool = _id(form, "tool_name", hints.get("tool_name"))
    millis = _millis(form, "expected_tool_duration_ms", hints.get("expected_tool_duration_ms"))
    return ClientHints(
        form if hints.get("workflow_id") is not None else None,
        workflow=_id(form, "workflow_id", hints.get("workflow_id")),
        agent=_id(form, "agent_id", hints.get("agent_id")),
        tool=tool,
        tool_seconds=millis / 1000 if millis is not None and tool is not None else None,
        reuse_hint=reuse,
    )


def sglang_session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    session = _id("sglang_session_id", "session_id", body.get("session_id"))
    return None if session is None else ClientHints("sglang_session_id", workflow=session)


def nvext_agent_context(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "nvext_agent_context"
    nvext = _object(form, "nvext", body.get("nvext"))
    context = _object(form, "nvext.agent_context", nvext.get("agent_context")) if nvext is not None else None
    if context is None:
        return None
    final = _flag(form, "session_final", context.get("session_final")) or False
    session = _id(form, "session_id", context.get("session_id"))
    if session is not None:
        found = _session(form, session, _id(form, "parent_session_id", context.get("parent_session_id")))
        return replace(found, final=final)
    # Older Dynamo: a workflow instance of a workflow type, each agent's chain of calls a program.
    workflow = _id(form, "workflow_id", context.get("workflow_id"))
    program = _id(form, "program_id", context.get("program_id"))
    app = _id(form, "workflow_type_id", context.get("workflow_type_id"))
    parent_program = _id(form, "parent_program_id", context.get("parent_program_id"))
    if workflow is None:
        return None
    return ClientHints(form, workflow=workflow, agent=program, final=final, app=app, parent_agent=parent_program)


def dynamo_headers(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "dynamo_headers"
    session = _header(form, headers, "x-dynamo-session-id")
    if session is None:
        return None
    return _session(form, session, _header(form, headers, "x-dynamo-parent-session-id"))


def claude_code(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "claude_code"
    session = _header(form, headers, "x-claude-code-session-id")
    if session is None:
        return None
    agent = _header(form, headers, "x-claude-code-agent-id")
    parent_agent = _header(form, headers, "x-claude-code-parent-agent-id")
    # A subagent's requests carry its agent id: its session is an agent's inside the main session's workflow.
    return ClientHints(form, workflow=session, agent=agent, subagent=agent is not None, parent_agent=parent_agent)


def codex(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "codex"
    session = _header(form, headers, "thread-id") or _header(form, headers, "session-id")
    if session is None:
        return None
    return _session(form, session, _header(form, headers, "x-codex-parent-thread-id"))


def x_session_id(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "x_session_id"
    session = _header(form, headers, "x-session-id")
    if session is None:
        return None
    return _session(form, session, _header(form, headers, "x-parent-session-id"))


def smg_routing_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    key = _header("smg_routing_key", headers, "x-smg-routing-key")
    return None if key is None else ClientHints("smg_routing_key", workflow=key, per_user=True)


def prompt_cache_key(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    key = _id("prompt_cache_key", "prompt_cache_key", body.get("prompt_cache_key"))
    return None if key is None else ClientHints("prompt_cache_key", workflow=key, per_user=True)


def nvext_agent_hints(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    form = "nvext_agent_hints"
    nvext = _object(form, "nvext", body.get("nvext"))
    hints = _object(form, "nvext.agent_hints", nvext.get("agent_hints")) if nvext is not None else None
    if hints is None:
        return None
    _flag(form, "speculative_prefill", hints.get("speculative_prefill"))
    return ClientHints(
        priority=_count(form, "priority", hints.get("priority"), -(1 << 31), (1 << 31) - 1),
        osl=_count(form, "osl", hints.get("osl")),
    )


def _final_header(headers: Mapping[str, str], body: Mapping[str, Any]) -> ClientHints | None:
    value = headers.get("x-dynamo-session-final")
    final = _flag("dynamo_headers", "x-dynamo-session-final", value) if value is not None else None
    return ClientHints(final=True) if final else None


PARSERS: dict[str, Callable[[Mapping[str, str], Mapping[str, Any]], ClientHints | None]] = {
    "sglang_agent_hints": sglang_agent_hints,
    "sglang_session_id": sglang_session_id,
    "nvext_agent_context": nvext_agent_context,
    "dynamo_headers": dynamo_headers,
    "claude_code": claude_code,
    "codex": codex,
    "x_session_id": x_session_id,
    "smg_routing_key": smg_routing_key,
    "prompt_cache_key": prompt_cache_key,
}
# Forms that carry hints alone, applied to whichever workflow the request rides with.
HINT_PARSERS = (nvext_agent_hints, _final_header)
# Every header and top-level body field the parsers above read: what a front carries past a proxy that drops
# them (agentcache/forwarded_hints.py; tests/test_front.py checks the parsers read no other).
HINT_HEADERS = frozenset(
    {
        "x-dynamo-session-id",
        "x-dynamo-parent-session-id",
        "x-dynamo-session-final",
        "x-claude-code-session-id",
        "x-claude-code-agent-id",
        "x-claude-code-parent-agent-id",
        "thread-id",
        "session-id",
        "x-codex-parent-thread-id",
        "x-session-id",
        "x-parent-session-id",
        "x-smg-routing-key",
    }
)
HINT_BODY_FIELDS = frozenset({"agent_hints", "session_id", "nvext", "prompt_cache_key"})


def _lower(headers: Any) -> dict[str, str]:
    """Headers by lower-case name, from any mapping of them (Starlette's Headers, a plain dict)."""
    if headers is None:
        return {}
    return {str(k).lower(): v for k, v in headers.items() if isinstance(v, str)}


def read_client_hints(headers: Any, body: Any) -> ClientHints | None:
    """The hints a request carries in other stacks' forms (headers: a mapping, case-insensitive names; body: the
    request's JSON object as sent, before SGLang's models drop unknown fields); None where it carries none."""
    headers = _lower(headers)
    body = body if isinstance(body, Mapping) else {}
    refused: list[str] = []
    named: ClientHints | None = None
    hint_only: list[ClientHints] = []
    for form in PRECEDENCE:
        try:
            found = PARSERS[form](headers, body)
        except HintError as exc:
            refused.append(exc.reason)
            continue
        if found is None:
            continue
        if found.workflow is not None and named is None:
            named = found
        elif found.workflow is None:
            hint_only.append(found)  # agent_hints without a workflow id: its agent, tool and reuse hint
    for parse_hints in HINT_PARSERS:
        try:
            found = parse_hints(headers, body)
        except HintError as exc:
            refused.append(exc.reason)
            continue
        if found is not None:
            hint_only.append(found)
    if named is None and not hint_only and not refused:
        return None
    merged = named or ClientHints()
    for extra in hint_only:
        merged = _merge(merged, extra)
    return replace(merged, refused=tuple(dict.fromkeys(refused)))


def _merge(named: ClientHints, extra: ClientHints) -> ClientHints:
    """`named` with what `extra` (a hint-only form) adds where `named` says nothing."""
    return replace(
        named,
        agent=named.agent or extra.agent,
        final=named.final or extra.final,
        tool=named.tool or extra.tool,
        tool_seconds=named.tool_seconds if named.tool is not None else extra.tool_seconds,
        reuse_hint=named.reuse_hint or extra.reuse_hint,
        priority=named.priority if named.priority is not None else extra.priority,
        osl=named.osl if named.osl is not None else extra.osl,
    )


def _our_workflow(headers: Mapping[str, str], body: Mapping[str, Any]) -> str | None:
    """The workflow our own tags name (chat: custom_params; /generate: sampling_params.custom_params; or the
    forwarded header), where they name a valid one."""
    params = body.get("sampling_params")
    if isinstance(params, list):
        params = params[0] if params else None
    found = find(body.get("custom_params"))
    if found is None and isinstance(params, Mapping):
        found = find(params.get("custom_params"))
    if found is None and headers.get(HEADER):
        try:
            found = header_object(headers[HEADER])
        except TagError:
            return None
    if not isinstance(found, Mapping):
        return None
    try:
        return check_id("workflow", found.get("workflow"))
    except TagError:
        return None


def routing_key(headers: Any, body: Any) -> str | None:
    """The key a front routes a request by: the workflow our tags name, else the one its other forms name (the
    same precedence as the intake's), so a session's requests follow its workflow to one worker."""
    lowered = _lower(headers)
    body = body if isinstance(body, Mapping) else {}
    ours = _our_workflow(lowered, body)
    if ours is not None:
        return ours
    hints = read_client_hints(lowered, body)
    return hints.workflow if hints is not None else None
