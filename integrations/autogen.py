"""AutoGen AgentChat: the agent name of each LLM request, each tool call, the team's plan and its speaker choices,
from AutoGen's own machinery.

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

The plan and the decisions: every group chat manager (RoundRobinGroupChat's,
SelectorGroupChat's, Swarm's) passes the speakers it has just chosen to its
`_log_speaker_selection` before it asks them to speak (after the selector's
own LLM call answered, or the handoff was read). Wrapped there, the SDK sends
the team's plan (agentcache_sdk.plan: a round robin's speaker order, a
selector chat's graph, manager to every participant and back, and the turn
limit, `max_turns` or the message limit of a MaxMessageTermination), the chosen
speakers as the workflow's next agents, and, once a round robin's turn limit
leaves an agent no further turn, that agent done. Nothing is guessed before
the manager has chosen.
"""

from __future__ import annotations

import logging
import re
import sys
import weakref
from typing import Any

from agentcache.integrations._once import HookOnce
from agentcache_sdk import add_agent_name_provider, agent_done, next_agents, plan, tool_ended, tool_started, workflow
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


def turn_limit(manager: Any) -> int | None:
    """The most turns the manager's team can take: its `max_turns`, or what its termination condition's message
    limits allow (a MaxMessageTermination of n messages: the task's and n - 1 turns; either of two: the smaller;
    both: the larger)."""
    limits = [manager._max_turns, _message_turns(manager._termination_condition)]
    known = [n for n in limits if isinstance(n, int) and n > 0]
    return min(known) if known else None


def _message_turns(condition: Any) -> int | None:
    from autogen_agentchat.base import AndTerminationCondition, OrTerminationCondition
    from autogen_agentchat.conditions import MaxMessageTermination

    if isinstance(condition, MaxMessageTermination):
        return max(condition._max_messages - 1, 1)
    if isinstance(condition, (OrTerminationCondition, AndTerminationCondition)):
        turns = [_message_turns(c) for c in condition._conditions]
        known = [n for n in turns if n is not None]
        if isinstance(condition, OrTerminationCondition):
            return min(known) if known else None
        return max(known) if known and len(known) == len(turns) else None
    return None


def team_plan(manager: Any) -> dict[str, Any] | None:
    """The plan of the manager's team, as the SDK's plan() takes it; None where the team declares none."""
    from autogen_agentchat.teams._group_chat._round_robin_group_chat import RoundRobinGroupChatManager
    from autogen_agentchat.teams._group_chat._selector_group_chat import SelectorGroupChatManager

    names, turns = list(manager._participant_names), turn_limit(manager)
    if isinstance(manager, RoundRobinGroupChatManager):
        return {"order": names, "max_turns": turns}
    if isinstance(manager, SelectorGroupChatManager):
        if manager._selector_func is None:  # the selector's model picks each speaker: its call comes between turns
            graph = {manager._name: names, **{name: [manager._name] for name in names}}
        else:  # the app's function picks among every participant
            graph = {name: names for name in names}
        return {"graph": graph, "max_turns": turns}
    return {"max_turns": turns} if turns is not None else None  # a swarm: its handoffs are decided as it runs


_planned: weakref.WeakSet[Any] = weakref.WeakSet()  # managers whose team's plan was given


def _chosen(manager: Any, speakers: list[str]) -> None:
    """The manager chose `speakers` to speak next: the plan (once per manager), then the choice."""
    if manager not in _planned:
        _planned.add(manager)
        team = team_plan(manager)
        if team is not None:
            plan(**{k: v for k, v in team.items() if v is not None})
    next_agents(speakers)
    _done_by_turns(manager)


def _done_by_turns(manager: Any) -> None:
    """A round robin with a turn limit: the agent that spoke last turn has no turn left when the turns still to
    come, counting this one, are fewer than a round."""
    from autogen_agentchat.teams._group_chat._round_robin_group_chat import RoundRobinGroupChatManager

    turns = turn_limit(manager)
    if not isinstance(manager, RoundRobinGroupChatManager) or turns is None or manager._current_turn < 1:
        return
    names = manager._participant_names
    previous = names[(manager._next_speaker_index - 2) % len(names)]
    if manager._current_turn - 1 + len(names) >= turns:
        agent_done(previous)


def _hook_speaker_choices() -> None:
    from autogen_agentchat.teams._group_chat._base_group_chat_manager import BaseGroupChatManager

    chosen = BaseGroupChatManager._log_speaker_selection

    async def _log_speaker_selection(self: Any, speaker_names: list[str]) -> None:
        try:
            _chosen(self, list(speaker_names))
        except Exception:  # an integration bug must not break the team
            sdk_logger.debug("agentcache: reading an AutoGen speaker choice failed", exc_info=True)
        await chosen(self, speaker_names)

    BaseGroupChatManager._log_speaker_selection = _log_speaker_selection  # type: ignore[method-assign]


def _hook() -> bool:
    """Report AgentChat's tool calls and its teams' plans and speaker choices; False when AgentChat is not
    installed."""
    try:
        from autogen_agentchat import EVENT_LOGGER_NAME
    except ImportError:
        return False
    events = logging.getLogger(EVENT_LOGGER_NAME)
    passes_from = events.getEffectiveLevel()
    events.addFilter(_ToolCalls(events, passes_from))
    if passes_from > logging.DEBUG:
        events.setLevel(logging.DEBUG)
    _hook_speaker_choices()
    return True


_hooks = HookOnce("autogen_agentchat", _hook)
install = _hooks.install

add_agent_name_provider(autogen_agent, on_workflow_start=_hooks.if_loaded)
_hooks.if_loaded()

__all__ = ["autogen_agent", "install", "team_plan", "turn_limit", "workflow"]
