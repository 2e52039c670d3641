"""The forms a bench's requests can name their workflow in: ours, and those of clients without our SDK.

A client that does not use our SDK says which session (our workflow) and agent a request belongs to in its own
stack's way, and ends the session its own way or not at all (docs/design/wire-format.md, other clients' forms).
`agentcache bench --client-form` sends the same workload in any of them, so a run in another form can be set
against a run with our tags: the same prompts, told apart only by what the server hears of workflows.

Each form here writes what that stack's client sends; the server's one reader of them is
agentcache/client_hints.py. No form but ours carries a fixed-prompt boundary or tool events (those clients have no
events route): the server finds an agent's fixed prompt by itself, as for any request without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class Ending(Enum):
    """How a form's workflow ends."""

    ROUTE = "route"  # ours: the plugin's end route (POST /agentcache/v1/workflows/{id}/end)
    CLOSE_SESSION = "close_session"  # SGLang's POST /close_session {"session_id": ...}
    FINAL = "final"  # the workflow's last request says it is the last (Dynamo's session_final)
    LEASE = "lease"  # nothing: the server retires the workflow when its lease runs out


@dataclass(frozen=True)
class ClientForm:
    name: str
    ending: Ending
    says: str  # what the form sends, in words (for --help)

    def tag(
        self, body: dict[str, Any], workflow: str, agent: str, fixed_tokens: int, final: bool, app: str | None = None
    ) -> dict[str, str]:
        """Put the request's workflow and agent into `body` (a /generate body) as this form does; the headers to
        send with it. `final`: the workflow's last request (the form's end where it ends so); `app`: the app whose
        plan it follows (ours alone says it)."""
        if self.name == OURS:
            tags = {"v": 1, "workflow": workflow, "agent": agent, "agent_name": agent, "fixed_tokens": fixed_tokens}
            if app is not None:
                tags["app"] = app
            body["sampling_params"]["custom_params"] = {"agentcache": tags}
            return {}
        if self.name == "sglang-session":
            body["session_id"] = workflow
            body["agent_hints"] = {"agent_id": agent}
            return {}
        if self.name == "agent-hints":
            body["agent_hints"] = {"workflow_id": workflow, "agent_id": agent}
            return {}
        if self.name == "dynamo":
            return {"x-dynamo-session-id": workflow, **({"x-dynamo-session-final": "true"} if final else {})}
        if self.name == "dynamo-nvext":
            body["nvext"] = {"agent_context": {"session_id": workflow, "session_final": final}}
            return {}
        if self.name == "claude-code":
            return {"x-claude-code-session-id": workflow, "x-claude-code-agent-id": agent}
        if self.name == "codex":
            return {"session-id": workflow}
        if self.name == "opencode":
            return {"x-session-id": workflow}
        if self.name == "routing-key":
            return {"x-smg-routing-key": workflow}
        if self.name == "prompt-cache-key":
            body["prompt_cache_key"] = workflow
            return {}
        raise AssertionError(f"no request shape for form {self.name!r}")


OURS = "ours"
FORMS = {
    f.name: f
    for f in (
        ClientForm(OURS, Ending.ROUTE, "our tags (custom_params.agentcache), ended on the end route"),
        ClientForm(
            "sglang-session", Ending.CLOSE_SESSION, "SGLang's session_id with agent_hints.agent_id, /close_session"
        ),
        ClientForm("agent-hints", Ending.LEASE, "SGLang's agent_hints (workflow_id, agent_id), the lease"),
        ClientForm("dynamo", Ending.FINAL, "X-Dynamo-Session-ID, X-Dynamo-Session-Final on the last request"),
        ClientForm("dynamo-nvext", Ending.FINAL, "nvext.agent_context (session_id, session_final on the last)"),
        ClientForm("claude-code", Ending.LEASE, "x-claude-code-session-id and -agent-id, the lease"),
        ClientForm("codex", Ending.LEASE, "Codex's session-id header, the lease"),
        ClientForm("opencode", Ending.LEASE, "x-session-id (OpenCode, vLLM's router), the lease"),
        ClientForm("routing-key", Ending.LEASE, "X-SMG-Routing-Key, the lease"),
        ClientForm("prompt-cache-key", Ending.LEASE, "OpenAI's prompt_cache_key, the lease"),
    )
}


def parse_forms(text: str) -> tuple[ClientForm, ...]:
    """`ours,dynamo` -> the forms, each once, in order; ValueError naming an unknown one."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in FORMS]
    if unknown or not names:
        raise ValueError(f"unknown client form {', '.join(unknown) or repr(text)}; choose from {', '.join(FORMS)}")
    return tuple(FORMS[n] for n in dict.fromkeys(names))


def run_label(policy: str, form: ClientForm) -> str:
    """A run's name: the policy's, and the form where it is not ours (`pbkv via dynamo`)."""
    return policy if form.name == OURS else f"{policy}{VIA}{form.name}"


VIA = " via "
