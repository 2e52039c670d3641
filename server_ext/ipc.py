"""Control messages between the HTTP process and the scheduler processes.

They ride SGLang's own control channel (tokenizer manager -> every scheduler
rank, replies from each data-parallel group's rank zero), so every tensor-
parallel rank applies the same event to its own tree in the same order.
Payloads are JSON text: SGLang's msgpack IPC mode cannot nest containers.
"""

from __future__ import annotations

from sglang.srt.managers.io_struct import BaseReq, hook_custom_types


class AgentCacheControl(BaseReq, kw_only=True):
    op: str
    payload: str = "{}"


class AgentCacheControlOutput(BaseReq, kw_only=True):
    ok: bool
    result: str = "{}"


def register_ipc_types() -> None:
    hook_custom_types(AgentCacheControl, AgentCacheControlOutput)
