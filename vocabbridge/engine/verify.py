"""Verification: which drafted tokens the target keeps, and the token it adds. One function.

Greedy: accept the longest prefix of the draft that equals the target's argmax, then add the
target's own argmax at the first mismatch (or after the last draft token): the output is
token-identical to plain greedy decoding, whatever the drafter proposed.

Sampling (Leviathan et al. 2023; Chen et al. 2023): accept draft token x with probability
min(1, p(x) / q(x)); on rejection sample from the normalized residual max(0, p − q); after k
acceptances sample the bonus token from p. For a deterministic proposal q is one-hot, so x is kept
with probability p(x) and the residual is p with x removed. The output is distributed exactly as
sampling from the target alone.
"""

from __future__ import annotations

import torch

from .sampling import SamplingParams, logits_to_probs, sample


def verify(
    target_logits: torch.Tensor,  # [n+1, V]: target logits after the last committed token and each draft token
    draft: list[int],  # [n] proposed target-vocabulary ids
    draft_probs: torch.Tensor | None,  # [n, V] drafter distribution over target ids; None → one-hot
    params: SamplingParams,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Return (number of draft tokens accepted, the next token from the target)."""
    n = len(draft)
    if params.greedy:
        best = target_logits.argmax(-1).tolist()  # [n+1]
        accepted = next((i for i in range(n) if draft[i] != best[i]), n)
        return accepted, best[accepted]
    p = logits_to_probs(target_logits, params)  # [n+1, V]
    for i, x in enumerate(draft):
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        p_x = float(p[i, x])
        u = float(torch.rand((), generator=generator))
        if q_x > 0 and u < min(1.0, p_x / q_x):
            continue
        # Rejected: sample from max(0, p − q), normalized.
        if draft_probs is None:
            residual = p[i].clone()
            residual[x] = 0.0
        else:
            residual = (p[i] - draft_probs[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0:  # p == q exactly: any residual is empty; p itself is then the right law
            return i, sample(p[i], generator)
        return i, sample(residual / total, generator)
    return n, sample(p[n], generator)
