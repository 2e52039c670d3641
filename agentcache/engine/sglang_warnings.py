"""Quiet SGLang's import-time warnings about GPU-only kernels, for a process that imports SGLang without a GPU.

Importing the engine (and so SGLang) without a GPU warns that quantization kernels nothing here uses need CUDA.
This module imports nothing from SGLang, so a command or a benchmark calls it before SGLang loads; the servers'
own logs keep their warnings.
"""

from __future__ import annotations

import warnings


def ignore_sglang_gpu_only_warnings() -> None:
    """Filter SGLang's quantization modules' "only CUDA supports ..." warnings from this process."""
    warnings.filterwarnings("ignore", category=UserWarning, module=r"sglang\.srt\.layers\.quantization\.")
