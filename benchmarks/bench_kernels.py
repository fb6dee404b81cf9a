"""One linear's cost on the CPU kernels a target could run on, at the decode shapes of Qwen2.5-Coder-1.5B
(its MLP's up/down projections and its fused q/k/v), 1 and 5 rows: fp32, fbgemm's dynamic int8 (one
weight scale per output row, what ``--dtype int8`` builds on) and torch's int4 weight-only kernel
(``_weight_int4pack_mm_for_cpu``, group size 32, fp32 and bf16 activations). Prints milliseconds per
call and each against fbgemm int8 measured in the same run, and the int4 kernel's error against
its own dequantized weights.

    python benchmarks/bench_kernels.py [--repeats 20]

The weights stay in the CPU's cache between calls here, so the absolute times are below a whole
model's (which streams its weights from memory); the ratios are what this compares.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

SHAPES = {"mlp up (8960×1536)": (8960, 1536), "mlp down (1536×8960)": (1536, 8960), "qkv (2048×1536)": (2048, 1536)}
GROUP = 32


def timed(fn, repeats: int) -> float:
    fn(), fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1e3


def int4_weights(w: torch.Tensor):
    """Asymmetric int4 per group of GROUP inputs in torch's packed CPU layout; (packed, scales+zeros, dequantized)."""
    n, k = w.shape
    g = w.view(n, k // GROUP, GROUP)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = lo + 8 * scale  # the kernel computes (q - 8) * scale + zero
    q = ((g - lo) / scale).round().clamp(0, 15).to(torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.view(n, k), 2)
    sz = torch.stack([scale.view(n, -1), zero.view(n, -1)], -1).transpose(0, 1).contiguous()
    return packed, sz, ((q.float() - 8) * scale + zero).view(n, k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call (× fbgemm int8)")
    for label, (n, k) in SHAPES.items():
        w = torch.randn(n, k) * 0.02
        lin = torch.nn.Linear(k, n, bias=False)
        lin.weight.data = w
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            q8 = torch.ao.quantization.quantize_dynamic(
                torch.nn.Sequential(lin), {torch.nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8
            )[0]
        packed, sz, deq = int4_weights(w)
        szb = sz.bfloat16()
        for rows in (1, 5):
            x = torch.randn(rows, k)
            xb = x.bfloat16()
            t8 = timed(lambda: q8(x), args.repeats)
            times = {
                "fp32": timed(lambda: x @ w.T, args.repeats),
                "int8": t8,
                "int4 fp32-act": timed(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz), args.repeats),
                "int4 bf16-act": timed(lambda: torch.ops.aten._weight_int4pack_mm_for_cpu(xb, packed, GROUP, szb), args.repeats),
            }
            err = float((torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, GROUP, sz) - x @ deq.T).abs().max())
            cells = ", ".join(f"{name} {ms:.2f} (×{ms / t8:.2f})" for name, ms in times.items())
            print(f"{label}, {rows} row{'s' if rows > 1 else ''}: {cells}; int4 error {err:.1e}")


if __name__ == "__main__":
    main()
