"""Workflow trace format, version 1 (docs/design/trace-format.md): the events, reading, validating, writing.

A trace is JSON Lines: an optional ``meta`` line (with an app's ``plan``), then ``request``, ``end``,
``tool_start``, ``tool_end``, ``next`` and ``agent_done`` events in the order they were sent. The modules, by
job: ``model`` holds the events and the trace (and the one check of each hint's fields, which the server
shares); ``reader`` validates lines (errors name the
file, the line and the field; event types it does not know are left out and counted); ``writer`` writes
events validated as the reader would, never truncating a file.
"""

from agentcache.trace.model import (
    EVENT_GROUPS,
    FORMAT_VERSION,
    AgentDone,
    End,
    Event,
    EventFieldError,
    Meta,
    Next,
    Plan,
    Request,
    Segment,
    ToolEnd,
    ToolEvent,
    ToolStart,
    Trace,
    agent_done_fields,
    next_fields,
    plan_fields,
    tool_fields,
)
from agentcache.trace.reader import TornTraceWarning, TraceError, UnknownEventsWarning, iter_trace, read_trace
from agentcache.trace.writer import TraceWriter, write_trace

__all__ = [
    "EVENT_GROUPS",
    "FORMAT_VERSION",
    "AgentDone",
    "End",
    "Event",
    "EventFieldError",
    "Meta",
    "Next",
    "Plan",
    "Request",
    "Segment",
    "ToolEnd",
    "ToolEvent",
    "ToolStart",
    "Trace",
    "TornTraceWarning",
    "TraceError",
    "UnknownEventsWarning",
    "iter_trace",
    "read_trace",
    "agent_done_fields",
    "next_fields",
    "plan_fields",
    "tool_fields",
    "TraceWriter",
    "write_trace",
]
