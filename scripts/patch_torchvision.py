"""Make PyPI's CUDA-linked torchvision importable beside CPU-only torch.

torchvision's wheel registers fake (meta) kernels for its compiled ops at import
time, unconditionally, and fails with "operator torchvision::nms does not exist"
when its compiled ops cannot load against CPU torch. SGLang imports torchvision
from its model configs, so the server cannot start without it. This rewrites the
two unconditional registrations to apply only when the compiled ops loaded, the
way the file's own `register_meta` helper already does. Idempotent.
"""

import importlib.util
import re
import sys
from pathlib import Path

MARK = "# agentcache: conditional on compiled ops"


def main() -> int:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        print("torchvision is not installed; nothing to patch", file=sys.stderr)
        return 1
    path = Path(spec.submodule_search_locations[0]) / "_meta_registrations.py"
    text = path.read_text()
    if MARK not in text:
        pattern = re.compile(r'^@torch\.library\.register_fake\("(torchvision::q?nms)"\)$', re.M)
        text, count = pattern.subn(
            r'@(torch.library.register_fake("\1") if torchvision.extension._has_ops() else (lambda f: f))  ' + MARK,
            text,
        )
        if count != 2:
            print(f"{path}: expected 2 registrations to patch, found {count}", file=sys.stderr)
            return 1
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
