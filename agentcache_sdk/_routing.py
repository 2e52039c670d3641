"""The routing key of a tagged request behind an agentcache cluster: workflow-aware, per request.

`agentcache serve --workers N` puts sglang-router's ``manual`` policy in
front of N workers and places the keys ``agentcache-worker-0 .. N-1`` one per
worker, so a slot is a worker. Behind it (the configured server answers
``GET /workers`` like the router), each tagged request carries the key of the
slot :class:`agentcache.routing.WorkflowAwareRouting` chooses for it: one
instance per SDK process and server, behind a lock, that learns from what it
routed and from the answers (each answer takes its request off the slot's
queue; the usage's prompt tokens calibrate the characters-per-token estimate
of later prompts, since the SDK sees text, not tokens; its output tokens the
agent's expected output, which sizes its homes (a streamed answer reports its
usage where the request asked for it, `stream_options={"include_usage": True}`;
an agent whose answers never report it is sized by every agent's mean output, 0
where none does); prompt and cached tokens are counted per slot,
`routing_stats()`). The decision needs no
server call beyond the cached worker listing.

With ``routing="workflow-affinity"``, or against a plain server, the key is
the workflow id, as before. End events go to every worker the router lists
(agentcache_sdk._events), which covers each one that served the workflow.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcache.routing import Placement, WorkflowAwareRouting, slot_key
from agentcache.tags import Tags
from agentcache_sdk._config import settings
from agentcache_sdk._workers import cluster_size

DEFAULT_CHARS_PER_TOKEN = 4.0
CALIBRATION_WEIGHT = 0.1  # of each answer, in the running characters-per-token estimate


@dataclass
class _SlotCounts:
    requests: int = 0
    answered: int = 0
    prompt_tokens: int = 0  # as the answers reported them
    cached_tokens: int = 0


class SlotRouter:
    """WorkflowAwareRouting for one cluster, safe to share between threads."""

    def __init__(self, base_url: str, workers: int):
        self.base_url = base_url
        self.routing = WorkflowAwareRouting(workers)
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN
        self.counts = [_SlotCounts() for _ in range(workers)]
        self._lock = threading.Lock()

    @property
    def workers(self) -> int:
        return len(self.counts)

    def choose(self, tags: Tags, prompt: float, fixed: float, conversation: str | None, in_chars: bool) -> Ticket:
        """Route one request whose prompt and fixed prompt are `prompt` and `fixed` characters (or tokens)."""
        with self._lock:
            scale = 1.0 / self.chars_per_token if in_chars else 1.0
            prompt_tokens = max(1, round(prompt * scale))
            fixed_tokens = min(prompt_tokens, round(fixed * scale))
            placement = self.routing.choose(tags.workflow, tags.agent, prompt_tokens, fixed_tokens, conversation)
            self.counts[placement.slot].requests += 1
        return Ticket(self, placement, prompt if in_chars else None)

    def answered(
        self, ticket: Ticket, prompt_tokens: int | None, cached_tokens: int | None, output_tokens: int | None
    ) -> None:
        with self._lock:
            self.routing.answered(ticket.placement, output_tokens)
            counts = self.counts[ticket.placement.slot]
            counts.answered += 1
            counts.prompt_tokens += prompt_tokens or 0
            counts.cached_tokens += cached_tokens or 0
            if ticket.chars and prompt_tokens:
                ratio = min(20.0, max(0.5, ticket.chars / prompt_tokens))
                self.chars_per_token += CALIBRATION_WEIGHT * (ratio - self.chars_per_token)

    def ended(self, workflow: str) -> set[int]:
        with self._lock:
            return self.routing.ended(workflow)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "routing": "workflow-aware",
                "base_url": self.base_url,
                "workers": self.workers,
                "chars_per_token": self.chars_per_token,
                "agent_slots": {agent: list(slots) for agent, slots in self.routing.agent_slots.items()},
                "agent_expected_output_tokens": {
                    agent: round(self.routing.expected_output(agent)) for agent in self.routing.agent_slots
                },
                "slots": [
                    {
                        "slot": i,
                        "key": slot_key(i),
                        "in_flight": self.routing.slots[i].in_flight,
                        **vars(c),
                    }
                    for i, c in enumerate(self.counts)
                ],
            }


@dataclass
class Ticket:
    """One routed request until its answer: `done` hands it back to its router exactly once."""

    router: SlotRouter
    placement: Placement
    chars: float | None  # the prompt's characters, for calibration (None: the SDK counted tokens)
    _done: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    @property
    def key(self) -> str:
        return slot_key(self.placement.slot)

    def done(
        self, prompt_tokens: int | None = None, cached_tokens: int | None = None, output_tokens: int | None = None
    ) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.router.answered(self, prompt_tokens, cached_tokens, output_tokens)


_routers: dict[str, SlotRouter] = {}
_routers_lock = threading.Lock()


def router_for(base_url: str, workers: int) -> SlotRouter:
    """The process's router for the cluster at `base_url` (a new one when its number of workers changed)."""
    with _routers_lock:
        router = _routers.get(base_url)
        if router is None or router.workers != workers:
            router = _routers[base_url] = SlotRouter(base_url, workers)
        return router


def route(path: str, body: Mapping[str, Any], tags: Tags, authorization: str | None) -> Ticket | None:
    """The slot for one tagged request to the configured server, or None: send the workflow id as before."""
    if settings.routing != "workflow-aware":
        return None
    if authorization:
        headers = {"Authorization": authorization}
    else:
        headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    workers = cluster_size(settings.base_url, headers)
    if workers is None:
        return None  # a plain server (or none that answers): nothing to choose
    return router_for(settings.base_url, workers).choose(tags, *prompt_size(path, body, tags))


def prompt_size(path: str, body: Mapping[str, Any], tags: Tags) -> tuple[float, float, str | None, bool]:
    """(prompt size, fixed-prompt size, conversation, sizes in characters) of a request body.

    Chat: the characters of the messages' contents and tool schemas; the fixed prompt is the leading
    `fixed_messages` messages and the tools; the conversation is a digest of the first message after it
    (the thread the prompt continues; None: the workflow). /generate: `text` characters, or `input_ids`
    tokens; its fixed prompt as the tags give it.
    """
    if path.endswith("/generate"):
        ids = body.get("input_ids")
        if isinstance(ids, list):
            return float(len(ids)), float(tags.fixed_tokens or 0), None, False
        text = body.get("text")
        return float(len(text) if isinstance(text, str) else 0), float(tags.fixed_chars or 0), None, True
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    tools = body.get("tools")
    tool_chars = len(json.dumps(tools, default=str)) if tools else 0
    sizes = [_chars(m) for m in messages]
    fixed = min(tags.fixed_messages or 0, len(messages))
    conversation = None
    if fixed < len(messages):
        first = json.dumps(messages[fixed], sort_keys=True, default=str).encode()
        conversation = "c:" + hashlib.sha256(first).hexdigest()[:16]
    return float(tool_chars + sum(sizes)), float(tool_chars + sum(sizes[:fixed])), conversation, True


def _chars(message: Any) -> int:
    if not isinstance(message, Mapping):
        return len(str(message))
    content = message.get("content")
    if isinstance(content, str):
        return len(content)
    return len(json.dumps(content, default=str)) if content is not None else 0


def forget(workflow: str) -> None:
    """A workflow ended: its routers stop tracking which slots served it."""
    with _routers_lock:
        routers = list(_routers.values())
    for router in routers:
        router.ended(workflow)


def routing_stats(base_url: str | None = None) -> dict[str, Any] | None:
    """What the workflow-aware routing did behind the cluster at `base_url` (default: the configured
    server): per slot, its key, requests routed, answered and in flight, and the prompt and cached tokens
    the answers reported; the agents' home slots. None when no request was routed there."""
    with _routers_lock:
        router = _routers.get((base_url or settings.base_url).rstrip("/"))
    return None if router is None else router.stats()
