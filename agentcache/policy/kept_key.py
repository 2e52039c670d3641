"""The slot a policy keeps a node's eviction key in (``NodeTags.kept``), apart from the node's tags.

Defined here, below both, so that the node's tags (agentcache.policy.nodes) can type the slot without importing
the policy that fills it (pbkv's keys module, agentcache.policy.pbkv.keys, the only reader and writer).
"""

from __future__ import annotations

from dataclasses import dataclass

NEVER = -1  # KeptKey.epoch of a key never computed


@dataclass(slots=True, eq=False)
class KeptKey:
    """One node's kept eviction key."""

    key: tuple | None = None
    epoch: int = NEVER  # the epoch it was computed in, or NEVER, or one of pbkv.keys' FORGOTTEN, RISEN
    rekey_at: float = 0.0  # policy clock at which the key changes with the node's age alone (0: never)
