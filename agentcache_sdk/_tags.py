"""The tags of one chat request: which agent sent it, and where its fixed prompt ends.

Agent id rule (docs/wire-format.md): a fingerprint of the agent's fixed prefix,

- the leading system/developer messages and the tool schemas, when the prompt
  starts with a system or developer message; the fixed prompt is then exactly
  those messages (``fixed_messages`` = their count; the tools come with them);
- otherwise (AutoGen's selector, prompts built from one template) the role and
  the first FIRST_CHARS characters of the first message, plus the tools; such
  a prompt has no fixed message, so ``fixed_messages`` is 0 and the server
  keeps no fixed boundary for it.

The framework's own name for the agent (LangGraph node, AutoGen agent, CrewAI
role) travels beside the id when an integration knows it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

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
