"""AutoGen AgentChat: the agent name of each LLM request, from the message handler context of the team run.

Inside a team run `MessageHandlerContext.agent_id().type` is the agent's name
followed by `_<team id>` (`coder_6f1c...`); the selector call of a
SelectorGroupChat comes from `SelectorGroupChatManager_<team id>`.
"""

from __future__ import annotations

import re
import sys

from agentcache_sdk import add_agent_name_provider, workflow

_TEAM_SUFFIX = re.compile(r"_[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def autogen_agent() -> str | None:
    core = sys.modules.get("autogen_core")
    if core is None:
        return None
    try:
        agent_type = core.MessageHandlerContext.agent_id().type
    except RuntimeError:  # not inside an agent's message handler
        return None
    return _TEAM_SUFFIX.sub("", agent_type)


add_agent_name_provider(autogen_agent)

__all__ = ["autogen_agent", "workflow"]
