"""Does a query row's attention result depend on how many masked keys follow its own? (SDPA on a
GPU, bf16, the shapes of a static-cache decode step.) Prints, per backend and cache length, whether
the rows equal the 1024-key result bit for bit, and the time per call."""

import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
H, KV, D, R, live = 12, 2, 128, 8, 700
q = torch.randn(1, H, R, D, device="cuda", dtype=torch.bfloat16)
K = torch.randn(1, KV, 16384, D, device="cuda", dtype=torch.bfloat16)
V = torch.randn(1, KV, 16384, D, device="cuda", dtype=torch.bfloat16)
pos = torch.arange(live - R, live, device="cuda")
for name, backends in [("default", None), ("efficient", [SDPBackend.EFFICIENT_ATTENTION]), ("math", [SDPBackend.MATH])]:
    ref = None
    for S in (1024, 2048, 4096, 16384):
        mask = (torch.arange(S, device="cuda")[None, :] <= pos[:, None])[None, None]
        k, v = K[:, :, :S].repeat_interleave(H // KV, 1), V[:, :, :S].repeat_interleave(H // KV, 1)
        ctx = sdpa_kernel(backends) if backends else torch.autocast("cuda", enabled=False)
        with ctx:
            f = lambda k=k, v=v, mask=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # noqa: E731
            out = f()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(50):
                f()
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t) / 50 * 1000
        ref = out if ref is None else ref
        print(f"{name:9s} S={S:5d}: equal to S=1024: {torch.equal(out, ref)}; {ms:.3f} ms")
