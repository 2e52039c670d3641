"""CPU-only STUB for the `sgl_kernel` package (NOT the real kernels).

sglang with SGLANG_USE_CPU_ENGINE=1 imports a few names from sgl_kernel at
module import time. The real CPU build of sgl-kernel is not on PyPI (the PyPI
wheels sgl-kernel / sglang-kernel are CUDA-only). On a CPU without Intel AMX,
sglang's layers fall back to torch-native code, so these names only need to
exist; calling one raises NotImplementedError naming the kernel.
Submodules are NOT stubbed (their import raises ImportError, so sglang's
try/except fallbacks apply), except scalar_type.py, copied verbatim from the
sglang-kernel 0.4.10 wheel (pure Python, Apache-2.0).
"""

__version__ = "0.0.0+cpustub"
SGL_KERNEL_CPU_STUB = True


def _missing(qualname):
    def _f(*args, **kwargs):
        raise NotImplementedError(f"{qualname} is not available: sgl_kernel CPU stub")

    _f.__name__ = qualname.rsplit(".", 1)[-1]
    _f.__qualname__ = qualname
    return _f


def _make_getattr(modname):
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _missing(f"{modname}.{name}")

    return __getattr__


__getattr__ = _make_getattr(__name__)
