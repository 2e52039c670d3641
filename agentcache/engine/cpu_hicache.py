"""What SGLang's host tier (HiCache) needs to run without a GPU; applied only where there is no CUDA.

HiCache pins its host pool with cudaHostRegister and copies KV through a CUDA
kernel (``transfer_kv_direct``). On a CPU-only machine pinning is meaningless
and the copy is an index copy between two CPU tensors. Supported with
``--hicache-io-backend direct --hicache-mem-layout layer_first``.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("agentcache")


def _transfer_kv_direct(src_layers, dst_layers, src_indices, dst_indices, page_size):  # noqa: ANN001
    """sgl_kernel.kvcacheio.transfer_kv_direct: dst[i][dst_indices] = src[i][src_indices] for every layer."""
    si = src_indices.to(torch.int64).cpu()
    di = dst_indices.to(torch.int64).cpu()
    for src, dst in zip(src_layers, dst_layers):
        dst.index_copy_(0, di, src.index_select(0, si).to(dst.dtype))


def apply_cpu_hicache_shims() -> bool:
    """Patch the two CUDA-only HiCache calls; False (and nothing done) when CUDA is available."""
    if torch.cuda.is_available():
        return False
    from sglang.srt.mem_cache.pool_host import common, mha

    common._cuda_host_register = lambda *args, **kwargs: None
    common._cuda_host_unregister = lambda *args, **kwargs: None
    mha.transfer_kv_direct = _transfer_kv_direct
    return True
