"""SGLang's radix cache as the replay builds it: CPU KV pools of exactly `capacity` token slots, with
SGLang's real HiCache as a host tier of `host_capacity` slots when asked.

The replay runs no model: the pools are the smallest SGLang accepts (it needs slots, not tensors), and
HiCache reads its settings from SGLang's published server args, made here from a one-layer stub config.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from agentcache.engine.adapter import FULL, TaggedFullComponent


def _host_tier_args(capacity: int, host_capacity: int) -> Any:
    """HiCache reads its settings from SGLang's published server args: publish what a replay needs."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sglang.srt import runtime_context
    from sglang.srt.server_args import ServerArgs

    from agentcache.engine.cpu_hicache import apply_cpu_hicache_shims

    apply_cpu_hicache_shims()
    # ServerArgs resolves a model config; a one-layer stub stands in (the replay runs no model).
    stub = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "agentcache" / "replay-model-config"
    stub.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 1,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": 128,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float16",
        "head_dim": 8,
    }
    (stub / "config.json").write_text(json.dumps(config))
    args = ServerArgs(
        model_path=str(stub),
        skip_tokenizer_init=True,
        device="cpu",
        enable_hierarchical_cache=True,
        hicache_ratio=host_capacity / capacity,
        hicache_io_backend="direct",
        hicache_mem_layout="layer_first",
        hicache_write_policy="write_through",
    )
    runtime_context.publish(args, role="test")
    return args


def build_cache(
    capacity: int,
    builtin: str | None = None,
    host_capacity: int = 0,
    *,
    alone: bool = False,
    sessions: bool = False,
    cache_class: type[UnifiedRadixCache] = UnifiedRadixCache,
) -> UnifiedRadixCache:
    """A UnifiedRadixCache (or `cache_class`, such as the server's) over CPU pools of exactly `capacity` slots
    (page size 1), with a host tier if asked.

    `builtin` picks one of SGLang's own strategies; otherwise the caller
    installs an agentcache policy. `alone`: the cache as SGLang builds it with
    no agentcache (its own FULL component, its default tree core). `sessions`: SGLang's session cache
    (``--enable-session-radix-cache``), which ranks eviction by session references, then by the strategy.
    """
    if alone and (builtin is None or host_capacity):
        raise ValueError("a cache without agentcache needs one of SGLang's strategies and no host tier")
    # The smallest KV pool SGLang accepts: the replay needs slots, not tensors.
    kv_pool = MHATokenToKVPool(
        size=capacity,
        page_size=1,
        dtype=torch.float16,
        head_num=1,
        head_dim=1,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    allocator = TokenToKVPoolAllocator(
        size=capacity, dtype=torch.float16, device="cpu", kvcache=kv_pool, need_sort=False
    )
    # Only the scheduler's checkpoint path reads req_to_token; the replay inserts directly.
    req_to_token = ReqToTokenPool(size=1, max_context_len=1, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=req_to_token,
        token_to_kv_pool_allocator=allocator,
        page_size=1,
        eviction_policy=builtin or "lru",
        eviction_policy_config=None,
        tree_components=(FULL,),
        component_registry_override=None if alone else {FULL: TaggedFullComponent},
        # agentcache needs the Python core (its strategy and components are Python); alone, SGLang chooses
        tree_core_backend=None if alone else "python",
        enable_session_radix_cache=sessions,
    )
    # With `builtin`, the tree core builds the strategy from SGLang's own table (and turns on
    # the per-node bookkeeping tlru needs), exactly as --radix-eviction-policy does.
    cache = cache_class(params)
    if host_capacity > 0:
        cache.init_hicache(_host_tier_args(capacity, host_capacity), params)
        cache.load_back_threshold = 1  # the server's default of 10 would skip tiny host hits; the replay counts all
    return cache
