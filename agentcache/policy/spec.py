"""Policy specs, parsed once: `pbkv`, `pbkv/-timing/+cost` (ablations), `pbkv+prefetch`, `lfu` (SGLang's own),
`session-lfu` (SGLang's session cache over its lfu).

The CLI, the replay, the live benchmark and the server take policy names from
users; each parses them here into :class:`PolicySpec` as soon as it gets them
(a bad name fails at once, saying what is allowed) and works from the spec.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from agentcache.policy.pbkv import Ingredients
from agentcache.policy.prefetch import AGGRESSIVE, CONSERVATIVE

OURS = ("lru", "lifecycle", "kvflow", "cachescout", "pbkv-paper", "pbkv", "belady")
OFFLINE = ("belady",)  # needs the whole trace: replay only
# SGLang 0.5.23's own --radix-eviction-policy strategies (its default is lru, which ours equals).
SGLANG_STRATEGIES = ("lru", "lfu", "slru", "tlru", "priority", "fifo", "mru", "filo")
# --enable-session-radix-cache over a strategy: each workflow a session, closed at its end.
SESSION_PREFIX = "session-"
SESSION_STRATEGIES = (f"{SESSION_PREFIX}lru", f"{SESSION_PREFIX}lfu")
# What a user has instead of agentcache: a flag or two.
BUILTINS = (*(s for s in SGLANG_STRATEGIES if s not in OURS), *SESSION_STRATEGIES)
WARMUP = "warmup"  # CacheScout-style warm-up requests instead of host-tier loads
PREFETCH_SUFFIXES = {"+prefetch": CONSERVATIVE, "+prefetch-aggressive": AGGRESSIVE, "+warmup": WARMUP}


class PolicyConfigError(ValueError):
    """A policy that does not exist, or was asked for without what it needs (a call graph, an oracle, ...)."""


@dataclass(frozen=True)
class PolicySpec:
    text: str  # as the user wrote it (names results and tables)
    name: str  # ours (OURS), one of SGLang's strategies, or one of them as a session cache (SESSION_STRATEGIES)
    ingredients: Ingredients | None = None  # pbkv and its ablations
    prefetch: str | None = None  # conservative | aggressive | warmup

    @property
    def builtin(self) -> bool:
        """One of SGLang's own strategies that agentcache has no policy of its own for (lfu, slru, ...)."""
        return self.name not in OURS

    @property
    def sessions(self) -> bool:
        """SGLang's session cache (--enable-session-radix-cache), each workflow a session."""
        return self.name in SESSION_STRATEGIES

    @property
    def strategy(self) -> str:
        """The --radix-eviction-policy SGLang runs for a built-in (a session cache's too)."""
        return self.name.removeprefix(SESSION_PREFIX) if self.sessions else self.name

    @property
    def online(self) -> bool:
        return self.name not in OFFLINE

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        text = text.strip()
        base, prefetch = text, None
        for suffix, mode in PREFETCH_SUFFIXES.items():
            if text.endswith(suffix):
                base, prefetch = text[: -len(suffix)], mode
                break
        name, _, variant = base.partition("/")
        if name not in OURS and name not in SGLANG_STRATEGIES and name not in SESSION_STRATEGIES:
            known = ", ".join(dict.fromkeys((*OURS, *SGLANG_STRATEGIES, *SESSION_STRATEGIES)))
            raise PolicyConfigError(f"unknown policy {text!r}; choose from {known} (and pbkv/-ingredient variants)")
        if variant and name != "pbkv":
            raise PolicyConfigError(f"{text!r}: only pbkv has ingredients to switch (pbkv/-timing/+cost)")
        if prefetch is not None and name != "pbkv":
            raise PolicyConfigError(f"{text!r}: prefetching works with pbkv policies only")
        ingredients = _ingredients(text, variant) if name == "pbkv" else None
        return cls(text, name, ingredients, prefetch)

    def __str__(self) -> str:
        return self.text


def _ingredients(text: str, variant: str) -> Ingredients:
    """`-timing/+cost`: the default pbkv with named ingredients switched off (-) or on (+)."""
    ingredients = Ingredients()
    for part in variant.split("/") if variant else ():
        field_name = part[1:].replace("-", "_")
        if part[:1] not in ("-", "+") or field_name not in Ingredients.__dataclass_fields__:
            known = ", ".join(f"[+-]{f.replace('_', '-')}" for f in Ingredients.__dataclass_fields__)
            raise PolicyConfigError(f"{text!r}: unknown ingredient {part!r}; use {known}")
        ingredients = replace(ingredients, **{field_name: part[0] == "+"})
    return ingredients


def parse_policies(text: str) -> list[PolicySpec]:
    """A comma-separated list of policies, each checked, duplicates dropped."""
    specs = [PolicySpec.parse(name) for name in dict.fromkeys(n.strip() for n in text.split(",") if n.strip())]
    if not specs:
        raise PolicyConfigError("no policy given")
    return specs
