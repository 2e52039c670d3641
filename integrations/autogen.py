"""AutoGen AgentChat: the agent name of each LLM request, and each tool call, from AutoGen's own machinery.

Inside a team run `MessageHandlerContext.agent_id().type` is the agent's name
followed by `_<team id>` (`coder_6f1c...`); the selector call of a
SelectorGroupChat comes from `SelectorGroupChatManager_<team id>`.

Tool calls: an AssistantAgent logs a `ToolCallRequestEvent` to AgentChat's
documented event logger (`autogen_agentchat.EVENT_LOGGER_NAME`) just before
it runs the calls its model asked for, and a `ToolCallExecutionEvent` once
they all returned, inline in the agent's own task (so in its workflow). A
filter on that logger reports them to the SDK by call id; the logger is set
to DEBUG, as AgentChat's logging guide does, and the filter lets on to the
app's handlers only the records its own level let through before. Installed
once the app has loaded AgentChat, at this import or when a workflow starts;
importing this module never imports it.
"""

from __future__ import annotations

import logging
import re
import sys

from agentcache.integrations._once import HookOnce
from agentcache_sdk import add_agent_name_provider, tool_ended, tool_started, workflow
from agentcache_sdk._counters import logger as sdk_logger

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


class _ToolCalls(logging.Filter):
    """Reports AgentChat's tool call events to the SDK; passes on what the logger's former level let through."""

    def __init__(self, events_logger: logging.Logger, passes_from: int):
        super().__init__()
        self._logger, self._passes_from = events_logger, passes_from
        from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent

        self._request, self._execution = ToolCallRequestEvent, ToolCallExecutionEvent

    def filter(self, record: logging.LogRecord) -> bool:
        event = record.msg
        try:
            if isinstance(event, self._request):
                for call in event.content:
                    tool_started(call.name, event.source, call.id or None)
            elif isinstance(event, self._execution):
                for result in event.content:
                    tool_ended(result.name, event.source, result.call_id or None)
        except Exception:  # an integration bug must not break the agent
            sdk_logger.debug("agentcache: reading an AutoGen event failed", exc_info=True)
        if self._logger.level != logging.DEBUG:  # the app set its own level since: that one decided already
            return True
        return record.levelno >= self._passes_from


def _hook() -> bool:
    """Report AgentChat's tool calls; False when AgentChat is not installed."""
    try:
        from autogen_agentchat import EVENT_LOGGER_NAME
    except ImportError:
        return False
    events = logging.getLogger(EVENT_LOGGER_NAME)
    passes_from = events.getEffectiveLevel()
    events.addFilter(_ToolCalls(events, passes_from))
    if passes_from > logging.DEBUG:
        events.setLevel(logging.DEBUG)
    return True


_hooks = HookOnce("autogen_agentchat", _hook)
install = _hooks.install

add_agent_name_provider(autogen_agent, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["autogen_agent", "install", "workflow"]
