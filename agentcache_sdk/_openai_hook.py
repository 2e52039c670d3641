"""The openai SDK's request hook: tags on a request's options, before the SDK makes its body.

LangGraph (langchain-openai), AutoGen (autogen-ext) and CrewAI all send through
the `openai` Python SDK, whose clients call ``_prepare_options`` on every
request, a hook documented for mutating options. It is private, so the
supported openai range is pinned in pyproject.toml (the cli extra) and tested.
"""

from __future__ import annotations

from typing import Any

from openai._base_client import AsyncAPIClient, SyncAPIClient

from agentcache_sdk._tagging import tag_openai_options_or_leave


def install() -> None:
    """Tag the requests of every openai client (run once openai is imported)."""
    sync_original = SyncAPIClient._prepare_options
    async_original = AsyncAPIClient._prepare_options

    def _prepare_options(self: Any, options: Any) -> Any:
        options = sync_original(self, options)
        tag_openai_options_or_leave(self, options)
        return options

    async def _prepare_options_async(self: Any, options: Any) -> Any:
        options = await async_original(self, options)
        tag_openai_options_or_leave(self, options)
        return options

    SyncAPIClient._prepare_options = _prepare_options
    AsyncAPIClient._prepare_options = _prepare_options_async
