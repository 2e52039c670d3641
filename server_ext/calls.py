"""The scheduler requests of one logical call: an ``n`` group's prefill-only warm-up and its n samples.

SGLang sends a prompt asked for n > 1 samples as n + 1 requests carrying one
stamp (``call`` and ``members`` in agentcache.tags.Stamped). The policy
observes the call once, with the first of them to arrive (the warm-up, which
SGLang waits for before it sends the samples), and the call is over when the
last of them is released: an implicit workflow ends then, not when the
warm-up finishes (which would end it while its samples still run).
"""

from __future__ import annotations

from collections import OrderedDict

from agentcache.tags import Stamped

# Calls and requests kept. A member that never reaches a release (aborted while queued) leaves its call here:
# the oldest go first beyond this, and a call that is no longer known counts as over.
MAX_CALLS = 1 << 16


class Calls:
    """Members not yet released, per call, in the order the calls arrived."""

    def __init__(self, max_calls: int = MAX_CALLS):
        self.max_calls = max_calls
        self._left: OrderedDict[str, int] = OrderedDict()  # call -> members not yet released
        self._call_of: OrderedDict[str, str] = OrderedDict()  # request id -> its call

    def join(self, rid: str, stamped: Stamped) -> bool:
        """Note the new request `rid`; True where the policy observes it: alone, or its call's first member."""
        call = stamped.call
        if call is None:
            return True
        first = call not in self._left
        if first:
            self._left[call] = stamped.members
            if len(self._left) > self.max_calls:
                self._left.popitem(last=False)
        self._call_of[rid] = call
        if len(self._call_of) > self.max_calls:
            self._call_of.popitem(last=False)
        return first

    def leave(self, rid: str) -> bool:
        """The request `rid` is released; True where that ends its call (or it was no member of one)."""
        call = self._call_of.pop(rid, None)
        if call is None:
            return True
        left = self._left.get(call, 1) - 1
        if left <= 0:
            self._left.pop(call, None)
            return True
        self._left[call] = left
        return False

    def __len__(self) -> int:
        return len(self._left)
