"""Dynamic int8 quantization (PyTorch's fbgemm kernels), shared by the drafters, the MTP heads and
the invariant int8 target (``invariant.RowInt8Linear`` wraps it so each row is scaled on its own)."""

from __future__ import annotations

import warnings

import torch


def quantize_int8(model: torch.nn.Module, *, per_channel: bool = False) -> torch.nn.Module:
    """Dynamic int8 quantization of every Linear (PyTorch's own ``quantize_dynamic``, fbgemm).

    For drafters only: a drafter's numerics never change what the engine outputs (the target
    verifies everything), and on a CPU a one-token forward is bound by reading the weights, so
    int8 weights make SmolLM2-135M ~2× and Qwen2.5-0.5B ~3× faster than fp32.
    ``per_channel``: one weight scale per output row instead of one per matrix.
    """

    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig if per_channel else torch.ao.quantization.default_dynamic_qconfig
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated", category=UserWarning)
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear: qconfig}, dtype=torch.qint8)
