"""One map shared by every composed row: healing that reaches the rows no answer names.

Healing the new lm_head rows one by one (``heal``'s rows stage) teaches only the rows the target's
answers name: on a CPU's 30 K positions a few thousand of 112 K composed rows, and those overfit
within an epoch. Here every composed row moves together, by a handful of shared parameters that a
few thousand answers can pin down:

    row(t) = s[n(t)] · (r(t) + r(t)·A + (f(t) − r(t))·B)

where ``r(t)`` is the zero-shot row (``--init``'s), ``f(t)`` the drafter's own output row of the first
piece spelling ``t``, ``n(t)`` the number of pieces (bucketed 2, 3, 4, 5+), ``A``, ``B`` two d × d
matrices (zero at the start) and ``s`` one scale per bucket (one at the start): the start is the
zero-shot drafter exactly. The map learns how a token spelled by several pieces should score beside
its pieces (the scales: longer tokens are rarer than their first piece), and one linear correction of
the zero-shot rows learned from the rows that do appear. Copied and special rows stay the drafter's.

The logits of a batch come from the transformed hidden states (``h + h·Aᵀ`` and ``h·Bᵀ`` against
the fixed ``r`` and ``f − r``), without writing the rows. The loss must be the full-vocabulary one:
the rows stage's candidate gradient (teacher's top-k and the drafter's likeliest tokens only) is
exact for free rows, which move alone, but not here, where every composed row moves with the shared
parameters: with it the scales grew without bound and the held-out loss tripled (measured,
benchmarks/results/2026-12-05-heal-shared-map). At the end the rows are written out as plain
lm_head rows: every engine takes them as before.

>>> import torch
>>> g = torch.Generator().manual_seed(0)
>>> base, first = torch.randn(10, 4, generator=g), torch.randn(10, 4, generator=g)
>>> m = SharedRowMap(base, first, torch.tensor([2, 5, 7]), torch.tensor([2, 3, 6]))
>>> bool(torch.equal(m.rows(), base))  # zero-shot at the start
True
>>> h = torch.randn(3, 4, generator=g)
>>> with torch.no_grad():
...     _ = m.A.normal_(generator=g), m.B.normal_(generator=g), m.log_scale.normal_(generator=g)
>>> bool(torch.allclose(m.logits(h), h @ m.rows().T, atol=1e-5))
True
"""

from __future__ import annotations

import torch

BUCKETS = (2, 3, 4, 5)  # pieces: 2, 3, 4, 5 or more (a composed token of one piece falls in the first)


def bucket_of(n_pieces: torch.Tensor) -> torch.Tensor:
    return (n_pieces.clamp(min=BUCKETS[0], max=BUCKETS[-1]) - BUCKETS[0]).long()


class SharedRowMap(torch.nn.Module):
    """The composed rows as one shared map of their zero-shot rows and their first pieces' rows."""

    def __init__(self, base: torch.Tensor, first: torch.Tensor, composed: torch.Tensor, n_pieces: torch.Tensor):
        """``base`` [V, d] the zero-shot rows; ``first`` [V, d] (or [len(composed), d]) the first piece's
        drafter row of each composed row; ``composed`` the composed row ids, ``n_pieces`` their lengths."""
        super().__init__()
        d = base.shape[1]
        self.register_buffer("base", base.detach().float().clone())
        comp = composed.long()
        f = first.detach().float()
        f = f[comp] if f.shape[0] == base.shape[0] else f
        self.register_buffer("composed", comp)
        self.register_buffer("delta", f - self.base[comp])
        self.register_buffer("bucket", bucket_of(n_pieces.long()))
        other = torch.ones(base.shape[0], dtype=torch.bool)
        other[comp] = False
        self.register_buffer("other", other.nonzero().squeeze(1))
        self.register_buffer("slot", torch.full((base.shape[0],), -1, dtype=torch.long))
        self.slot[comp] = torch.arange(len(comp))
        self.A = torch.nn.Parameter(torch.zeros(d, d))
        self.B = torch.nn.Parameter(torch.zeros(d, d))
        self.log_scale = torch.nn.Parameter(torch.zeros(len(BUCKETS)))

    def rows(self) -> torch.Tensor:
        """Every row, the composed ones through the map: what goes into the lm_head."""
        out = self.base.clone()
        r = self.base[self.composed]
        out[self.composed] = self.log_scale.exp()[self.bucket, None] * (r + r @ self.A + self.delta @ self.B)
        return out

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[B, V] logits of hidden states ``h`` [B, d] (without materializing the rows)."""
        out = torch.empty(h.shape[0], self.base.shape[0], dtype=h.dtype, device=h.device)
        out[:, self.other] = h @ self.base[self.other].T
        comp = (h + h @ self.A.T) @ self.base[self.composed].T + (h @ self.B.T) @ self.delta.T
        out[:, self.composed] = comp * self.log_scale.exp()[self.bucket]
        return out
