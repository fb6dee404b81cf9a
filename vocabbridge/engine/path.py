"""Which target path runs: ``--kernels auto`` and ``--dtype auto`` made concrete, with the reason.

The defaults pick the fast *exact* path, never the slow one (measured on the 1.5B target, 2 CPU
cores): on a CPU, llama.cpp's kernels for a GGUF target where llama-cpp-python is installed (~21
tok/s, level with llama.cpp itself), else the int8 invariant target (~10 tok/s); fp32 (~2.6 tok/s)
only when asked. Our q4 kernels where a drafter runs over a GGUF that is Q4_K nearly throughout
(:data:`Q4_DEFAULT_SHARE`): they take its Q4_K tensors as they are, and their extra verification rows
cost little (n-gram drafting 1.55x llama.cpp's plain decoding against 1.08x on llama.cpp's kernels);
over a Q4_K_M file, whose other third they would re-quantize to 4 bits, only when asked. Both are batch-invariant, so speculative output stays token-identical to plain.
On CUDA, torch in bf16 on a static cache replayed as CUDA graphs, every decode-time forward over
the same rows so speculative output stays identical there too (:mod:`.static`). Every command's ready line and ``vocabbridge doctor`` print the choice and
why (:attr:`TargetPath.why`).

>>> from vocabbridge.spec import EngineSpec
>>> p = choose_path(EngineSpec(target="/no/such/model", dtype="float32"), device="cpu")
>>> (p.kernels, p.dtype, p.why)
('torch', 'float32', '--dtype float32 asked for: the torch target in float32')
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from ..presets import resolve_model
from ..spec import EngineSpec

Q4_DEFAULT_SHARE = 0.9  # a GGUF whose weights are at least this share Q4_K (by bytes) drafts on our q4 kernels by default
Q4_MEASURED = "drafting 1.55-1.60x llama.cpp's plain decoding where llama.cpp's own kernels give 1.08x, measured on 2 AVX2 cores"
HIDDEN_STATE_DRAFTERS = ("mtp", "self")  # they read the target's hidden states or layers: torch only
LLAMA_INSTALL = "pip install 'vocabbridge[llama]'"


@dataclass(frozen=True)
class TargetPath:
    kernels: str  # torch | llama.cpp | q4 | what --kernels names
    dtype: str  # the target's dtype: int8 (invariant), float32, bfloat16 …; "gguf" on llama.cpp's kernels, "q4" on ours
    device: str
    why: str

    def apply(self, spec: EngineSpec) -> EngineSpec:
        """``spec`` with the chosen kernels and dtype in place of auto."""
        return spec.replace(kernels=self.kernels, dtype=spec.dtype if self.kernels in ("llama.cpp", "q4") else self.dtype)

    def label(self) -> str:
        """``llama.cpp kernels (GGUF as is)``, ``torch int8 (invariant)``, ``torch bfloat16 on cuda`` …"""
        if self.kernels == "llama.cpp":
            return "llama.cpp kernels (the GGUF as it is)"
        if self.kernels == "q4":
            return "q4 kernels (4-bit, batch-invariant)"
        if self.device != "cpu":
            return f"{self.kernels} {self.dtype} on {self.device} (static cache, CUDA graphs, batch-invariant)"
        return f"{self.kernels} {self.dtype}{' (batch-invariant)' if self.dtype == 'int8' else ''}"


def is_gguf(source: str) -> bool:
    """Whether ``source`` (a name resolved through the presets) is a GGUF file, or a folder holding one."""
    p = Path(resolve_model(source)).expanduser()
    if p.is_file():
        return p.suffix == ".gguf"
    return p.is_dir() and not (p / "config.json").is_file() and len(list(p.glob("*.gguf"))) == 1


def llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def choose_path(spec: EngineSpec, *, device: str) -> TargetPath:
    """The target path for ``spec`` on ``device`` (already resolved: cpu, cuda, cuda:1 …)."""
    if spec.kernels != "auto":
        dtype = spec.dtype if spec.dtype != "auto" else _auto_dtype(device)
        own = {"llama.cpp": "gguf", "q4": "q4"}.get(spec.kernels, dtype)
        return TargetPath(spec.kernels, own, device, f"--kernels {spec.kernels} asked for")
    if device != "cpu":
        dtype = spec.dtype if spec.dtype != "auto" else "bfloat16"
        return TargetPath("torch", dtype, device, f"a GPU ({device}): torch in {dtype}")
    if spec.dtype != "auto":
        return TargetPath("torch", spec.dtype, device, f"--dtype {spec.dtype} asked for: the torch target in {spec.dtype}")
    if spec.drafter_method in HIDDEN_STATE_DRAFTERS:
        return TargetPath(
            "torch",
            "int8",
            device,
            f"--drafter {spec.drafter_method} reads the target's hidden states, which llama.cpp's kernels do not expose: "
            "the int8 invariant target",
        )
    if not is_gguf(spec.target_name):
        return TargetPath("torch", "int8", device, "the target is not a GGUF file: the int8 invariant target")
    share = q4k_share(spec.target_name) if spec.drafter_method != "none" and q4_built() else None
    if share is not None and share >= Q4_DEFAULT_SHARE:
        return TargetPath(
            "q4",
            "q4",
            device,
            f"a GGUF target {share:.0%} Q4_K, with a drafter: our q4 kernels, its Q4_K tensors as they are and each "
            f"weight block decoded once for every verification row ({Q4_MEASURED})",
        )
    if not llama_cpp_installed():
        return TargetPath(
            "torch",
            "int8",
            device,
            f"llama-cpp-python is not installed ({LLAMA_INSTALL} for llama.cpp's kernels, about twice as fast): "
            "the int8 invariant target",
        )
    why = "a GGUF target and llama-cpp-python installed: llama.cpp's kernels"
    if share is not None and share >= 0.5:
        why += (
            f"; --kernels q4 is faster with a drafter ({Q4_MEASURED}) but re-quantizes the {1 - share:.0%} of the weights that are "
            "not Q4_K to 4 bits"
        )
    return TargetPath("llama.cpp", "gguf", device, why)


def q4_built() -> bool:
    """Whether our q4 kernels (the compiled extension ``vocabbridge._q4``) are importable."""
    from . import q4

    return q4.available()


def q4k_share(source: str) -> float | None:
    """The share, by bytes, of a GGUF's matmul weights stored as Q4_K (what our q4 kernels take as
    they are; the rest they re-quantize to Q4_K): every 2-D tensor but the token embedding, which
    counts where it is also the lm_head (no ``output.weight``). None where the file cannot be read."""
    try:
        from gguf import GGMLQuantizationType, GGUFReader

        from .q4 import gguf_of

        p = gguf_of(resolve_model(source))
        tensors = [t for t in GGUFReader(str(p)).tensors if len(t.shape) == 2]
    except Exception:  # not a GGUF, a truncated one, gguf missing: no opinion
        return None
    tied = not any(t.name == "output.weight" for t in tensors)
    weights = [t for t in tensors if t.name != "token_embd.weight" or tied]
    total = sum(int(t.n_bytes) for t in weights)
    q4k = sum(int(t.n_bytes) for t in weights if t.tensor_type == GGMLQuantizationType.Q4_K)
    return q4k / total if total else None


def _auto_dtype(device: str) -> str:
    return "int8" if device == "cpu" else "bfloat16"
