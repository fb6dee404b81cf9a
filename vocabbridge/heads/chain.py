"""The chained forward of an MTP head over whole sequences, its loss, and its offline evaluation.

Chained draft steps are computed in parallel (as EAGLE/HASS's "training-time test"): step d at
position p reads the head's own output of step d−1 at position p−1 and the true token x_{p+1},
and attends exactly to what the engine's head cache holds when it drafts there: step-1 entries up
to p−d+1, then one entry of each later step (:func:`chain_mask`). So a head's held-out acceptance
here is the acceptance the engine measures on the target's greedy output, up to the target's dtype
(tests/test_heads.py checks the chain against the engine's incremental drafting).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .data import Sequence
from .model import MTPHead

# ==== batches =====================================================================================


@dataclass
class Batch:
    hidden: torch.Tensor  # [B, L, d] the target's hidden states
    next_hidden: torch.Tensor  # [B, L, d] the target's hidden state one position on (what the head should output)
    next_tokens: torch.Tensor  # [B, L] x_{p+1}
    positions: torch.Tensor  # [B, L]
    label_ids: torch.Tensor  # [B, L, K] draft ids of the target's top-k after x_{p+1} (0 where absent)
    label_p: torch.Tensor  # [B, L, K] their probabilities, renormalized over the draft vocabulary
    greedy: torch.Tensor  # [B, L] the target's greedy token there (target ids)
    valid: torch.Tensor  # [B, L] a label exists
    generated: torch.Tensor  # [B, L] x_{p+1} is the target's own output (evaluation counts these)

    def to(self, device) -> Batch:
        return Batch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


def collate(seqs: list[Sequence], t2d: torch.Tensor, max_len: int) -> Batch:
    """Pad sequences into one batch; labels move to draft ids (mass outside the draft vocabulary is dropped)."""
    lens = [min(s.positions, max_len) for s in seqs]
    b, length, d = len(seqs), max(lens), seqs[0].hidden.shape[1]
    k = seqs[0].topk_ids.shape[1]
    out = Batch(
        hidden=torch.zeros(b, length, d),
        next_hidden=torch.zeros(b, length, d),
        next_tokens=torch.zeros(b, length, dtype=torch.long),
        positions=torch.arange(length).expand(b, length).clone(),
        label_ids=torch.zeros(b, length, k, dtype=torch.long),
        label_p=torch.zeros(b, length, k),
        greedy=torch.full((b, length), -1, dtype=torch.long),
        valid=torch.zeros(b, length, dtype=torch.bool),
        generated=torch.zeros(b, length, dtype=torch.bool),
    )
    for i, (s, n) in enumerate(zip(seqs, lens)):
        out.hidden[i, :n] = s.hidden[:n].float()
        out.next_hidden[i, : n - 1] = s.hidden[1:n].float()
        out.next_tokens[i, :n] = s.tokens[1 : n + 1]
        m = n - 1  # positions with a label: p ≤ n-2 (the label is position p+1's distribution)
        ids = s.topk_ids[1 : m + 1].long()
        draft = t2d[ids]  # [m, K], -1 outside the draft vocabulary
        p = s.topk_p[1 : m + 1].float() * (draft >= 0)
        out.label_ids[i, :m] = draft.clamp(min=0)
        out.label_p[i, :m] = p / p.sum(-1, keepdim=True).clamp(min=1e-9)
        out.greedy[i, :m] = ids[:, 0]
        out.valid[i, :m] = p.sum(-1) > 0
        out.generated[i, :m] = torch.arange(1, m + 1) >= s.gen_start
    return out


def batches(seqs: list[Sequence], *, batch_tokens: int, rng: random.Random) -> list[list[Sequence]]:
    """Shuffled batches of about ``batch_tokens`` positions each (similar lengths together)."""
    order = sorted(seqs, key=lambda s: s.positions * (1 + 0.2 * rng.random()))
    out, cur, longest = [], [], 0
    for s in order:
        n = min(s.positions, batch_tokens)
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(s)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


# ==== the chained forward and the loss ==============================================================


def chain_mask(length: int, step: int, *, device=None) -> torch.Tensor:
    """Mask [1, 1, L, step·L] (True = may attend) for chained step ``step`` over the keys of steps 1 … step.

    Query p of step d sees step-1 keys 0 … p−d+1 and, of each later step s, the key at p−d+s:
    what the head cache holds when the engine drafts token d at that position.

    >>> chain_mask(3, 2)[0, 0].int().tolist()
    [[0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1]]
    """
    p = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    blocks = [j <= p - step + 1] + [j == p - step + s for s in range(2, step + 1)]
    return torch.cat(blocks, dim=1)[None, None]


def chain(head: MTPHead, batch: Batch, depth: int) -> list[torch.Tensor]:
    """The head's outputs [B, L, d] for chained steps 1 … depth (see the module docstring)."""
    cache = DynamicCache()
    outs: list[torch.Tensor] = []
    g = batch.hidden
    for d in range(1, depth + 1):
        if d > 1:
            g = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)  # step d reads step d−1 at p−1
        mask = chain_mask(g.shape[1], d, device=g.device)
        g = head(g, batch.next_tokens, batch.positions, cache=cache, mask=mask)
        outs.append(g)
    return outs


def soft_ce(logits: torch.Tensor, batch: Batch, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid positions of −Σ_k p_k log q(id_k) (the target's top-k as soft labels)."""
    logq = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.label_ids)  # [B, L, K]
    per = -(batch.label_p * logq).sum(-1)
    n = valid.sum().clamp(min=1)
    return (per * valid).sum() / n


def hidden_mse(g: torch.Tensor, batch: Batch, valid: torch.Tensor) -> torch.Tensor:
    """Mean over valid positions of ‖g − h_{p+1}‖² / ‖h_{p+1}‖²: the head's output against the target's
    own next hidden state (which the lm_head turns into the target's distribution: EAGLE's feature loss)."""
    want = batch.next_hidden
    per = (g.float() - want).pow(2).sum(-1) / want.pow(2).sum(-1).clamp(min=1e-6)
    return (per * valid).sum() / valid.sum().clamp(min=1)


def chain_loss(
    head: MTPHead, batch: Batch, depth: int, step_weight: float, hidden_weight: float = 0.0
) -> tuple[torch.Tensor, list[float]]:
    """The weighted loss over chained steps (soft cross-entropy, plus ``hidden_weight`` × the feature
    loss), and each step's cross-entropy."""
    outs = chain(head, batch, depth)
    total, weights, parts = 0.0, 0.0, []
    for d, g in enumerate(outs, start=1):
        valid = batch.valid & (batch.positions >= d - 1)
        ce = soft_ce(head.logits(g), batch, valid)
        loss = ce + hidden_weight * hidden_mse(g, batch, valid) if hidden_weight else ce
        w = step_weight ** (d - 1)
        total = total + w * loss
        weights += w
        parts.append(float(ce.detach()))
    return total / weights, parts


# ==== evaluation ===================================================================================


@torch.inference_mode()
def evaluate(
    head: MTPHead,
    seqs: list[Sequence],
    t2d: torch.Tensor,
    *,
    k: int,
    batch_tokens: int,
    device,
    autocast,
    full_vocab: bool = False,
) -> dict:
    """Greedy acceptance per draft position on ``seqs`` (their generated part), as the engine
    counts it: draft token j is accepted when tokens 1 … j all equal the target's greedy tokens.
    ``full_vocab`` also scores the head drafting over the whole vocabulary (the target's lm_head),
    as vLLM runs our export (``acceptance_per_position_full_vocab``)."""
    d2t = head.d2t.to(device) if head.d2t is not None else None
    scorers = {"": lambda g: d2t[head.logits(g).argmax(-1)] if d2t is not None else head.logits(g).argmax(-1)}
    if full_vocab and head.lm_head is not None:
        scorers["_full_vocab"] = lambda g: head.parts.lm_head(g).argmax(-1)
    accepted = {name: [0] * k for name in scorers}
    windows, loss_sum, loss_n = 0, 0.0, 0
    for group in batches(seqs, batch_tokens=batch_tokens, rng=random.Random(0)):
        b = collate(group, t2d, batch_tokens).to(device)
        with autocast():
            outs = chain(head, b, k)
            loss_sum += float(soft_ce(head.logits(outs[0]), b, b.valid)) * int(b.valid.sum())
            preds = {name: [predict(g) for g in outs] for name, predict in scorers.items()}
        loss_n += int(b.valid.sum())
        # a draft whose first token step 1 predicts at p (after the generated token x_{p+1}): its
        # token s+1 comes from step s+1 at p + s; count the drafts whose k tokens all have labels
        window = b.generated.clone()
        for s in range(k):
            window &= _ahead(b.valid, s)
        windows += int(window.sum())
        for name, pred in preds.items():
            ok = window.clone()
            for s, p in enumerate(pred):
                ok &= _ahead(p == b.greedy, s)
                accepted[name][s] += int(ok.sum())
    out = {"positions": windows}
    for name, counts in accepted.items():
        rates = [a / windows if windows else float("nan") for a in counts]
        out[f"acceptance_per_position{name}"] = rates
        out[f"mean_acceptance_length{name}"] = 1 + sum(rates) if windows else float("nan")
    out["loss"] = loss_sum / loss_n if loss_n else float("nan")
    return out


def _ahead(x: torch.Tensor, s: int) -> torch.Tensor:
    """[B, L] → [B, L] with out[:, p] = x[:, p + s] (False past the end)."""
    return torch.cat([x[:, s:], torch.zeros_like(x[:, :s])], dim=1) if s else x
