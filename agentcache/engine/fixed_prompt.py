"""A request's fixed-prompt boundary in SGLang's radix tree, the same for the plugin and the replay.

The boundary reaches the engine as a token offset: the HTTP process resolved
the client's messages or characters to tokens (server_ext/intake.py), and a
trace counts tokens. :func:`fixed_offset` makes it the page-aligned offset
inside the prompt where the tree can put a node boundary, and
:func:`split_and_tag` puts one there on the request's path and tags the path
for the policy, so an agent's fixed prompt and the workflow's dynamic suffix
are separate nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentcache.engine.adapter import ends_at, path_nodes, split_at
from agentcache.tags import Tags


def fixed_offset(fixed_tokens: int, prompt_tokens: int, page_size: int = 1) -> int:
    """The token offset where the tree splits for a fixed prompt of `fixed_tokens` tokens: within the prompt,
    rounded down to a whole page (a radix node holds whole pages)."""
    fixed = min(fixed_tokens, prompt_tokens)
    return fixed - fixed % page_size


def split_and_tag(
    cache: Any,
    end: Any,
    key: Any,
    values: Any,
    fixed: int,
    tag_path: Callable[..., Any],
    tags: Tags,
    now: float,
    matched_tokens: int | None = None,
    prompt_tokens: int | None = None,
    *,
    prompt_end: int | None = None,
    priority: int = 0,
) -> list[Any]:
    """Put node boundaries on the inserted path ending at node `end` and tag it; the path, root's child first.

    `key` holds (at least) the path's tokens and `values` their slots (None: the tree's own, read only when
    a split needs them). A boundary goes at `fixed` (from :func:`fixed_offset`) unless a node ends there
    already (most requests share a fixed prompt split before), and at `prompt_end` where the caller inserted
    a finished request's output with its prompt and SGLang did not split them (the replay: SGLang's
    checkpoint does that split, one priority above the request's). Then ``tag_path(path, tags, now,
    matched_tokens, prompt_tokens)``: the policy's, or the caller's guard around it.
    """
    if prompt_end is not None:
        split_at(cache, key, values, prompt_end, priority=priority + 1)
    path = path_nodes(cache, end)
    if not ends_at(path, fixed) and fixed < sum(len(node.key) for node in path):
        split_at(cache, key, cache.path_device_indices(end) if values is None else values, fixed, priority=priority)
        path = path_nodes(cache, end)
    tag_path(path, tags, now, matched_tokens, prompt_tokens)
    return path
