"""Mixed traffic: two traces merged into one, as one server would see them side by side.

`chat+code-retry` is plain chat sharing the server with an agent app: half the
`workflows` are chat conversations, half code-retry workflows, each half
arriving at half the `rate`. `loop_prob` and `rebuild` are the agent app's;
chat keeps its defaults.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import replace

from agentcache.trace import AgentDone, End, Event, Meta, Next, ToolEvent, Trace
from agentcache.workloads import chat, code_retry
from agentcache.workloads.common import GenConfig

FAMILY = f"{chat.FAMILY}+{code_retry.FAMILY}"


def _renamer(label: str, clashes: set[str]) -> Callable[[str], str]:
    return lambda name: f"{label}/{name}" if name in clashes else name


def mix(first: Trace, second: Trace) -> Trace:
    """Both traces' events in one time order (ties: the first trace's first), each request tagged with its trace's
    name as `app` unless it has one.

    Workflow ids and agent ids that occur in both traces are prefixed with the trace's name (`name/id`, or `1/`
    and `2/` when the names do not tell the traces apart), so workflows stay distinct and an agent keeps one
    fixed prompt. Content ids are kept: the same id is the same tokens in either trace. The call graph is the
    union of both, or none when either trace lacks one. The mix has no plan: a trace's plan is one app's.
    """
    names = (first.meta.name, second.meta.name)
    labels = names if all(names) and names[0] != names[1] else ("1", "2")
    workflows = [{e.workflow for e in t.events} for t in (first, second)]
    agents = [{r.agent for r in t.requests} for t in (first, second)]
    workflow_clash, agent_clash = workflows[0] & workflows[1], agents[0] & agents[1]

    def relabel(trace: Trace, label: str) -> list[Event]:
        workflow, agent = _renamer(label, workflow_clash), _renamer(label, agent_clash)
        events: list[Event] = []
        for e in trace.events:
            if isinstance(e, End):
                events.append(End(e.ts, workflow(e.workflow)))
            elif isinstance(e, (ToolEvent, AgentDone)):
                events.append(replace(e, workflow=workflow(e.workflow), agent=agent(e.agent)))
            elif isinstance(e, Next):
                events.append(replace(e, workflow=workflow(e.workflow), agents=tuple(map(agent, e.agents))))
            else:
                events.append(replace(e, workflow=workflow(e.workflow), agent=agent(e.agent), app=e.app or label))
        return events

    graph = None
    if first.meta.call_graph is not None and second.meta.call_graph is not None:
        graph = {}
        for trace, label in zip((first, second), labels, strict=True):
            agent = _renamer(label, agent_clash)
            for caller, callees in trace.meta.call_graph.items():
                graph.setdefault(agent(caller), []).extend(agent(c) for c in callees)
        graph = {a: sorted(set(c)) for a, c in sorted(graph.items())}
    meta = Meta(
        name="+".join(names) if all(names) else "mix",
        description=f"{names[0]} ({first.meta.description}) mixed with {names[1]} ({second.meta.description})",
        call_graph=graph,
        extra={"parts": list(labels)},
    )
    merged = heapq.merge(relabel(first, labels[0]), relabel(second, labels[1]), key=lambda e: e.ts)
    return Trace(meta, list(merged))


def generate(cfg: GenConfig) -> Trace:
    chat_cfg = replace(
        cfg, workflows=max(1, cfg.workflows // 2), rate=cfg.rate / 2, loop_prob=None, rebuild=None, seed=cfg.seed + 1
    )
    agent_cfg = replace(cfg, workflows=max(1, cfg.workflows - chat_cfg.workflows), rate=cfg.rate / 2)
    trace = mix(chat.generate(chat_cfg), code_retry.generate(agent_cfg))
    trace.meta.name = FAMILY
    trace.meta.extra["generator"] = {"family": FAMILY, **cfg.knobs()}
    return trace
