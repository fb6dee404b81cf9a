"""The chained forward of an MTP head over whole sequences, its loss, and its offline evaluation;
the parallel forward of a P-EAGLE head (:func:`parallel`) in the same shape, so both share the loss
and the evaluation.

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

from ..heads.draft_head import DraftHead, norm_scale
from ..heads.peagle import MASK
from .data import Sequence

# ==== batches =====================================================================================


@dataclass
class Batch:
    hidden: torch.Tensor  # [B, L, F] the target's features the head reads (final hidden states, d; EAGLE-3: n·d)
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


def collate(seqs: list[Sequence], t2d: torch.Tensor, max_len: int, *, features: str = "hidden") -> Batch:
    """Pad sequences into one batch; labels move to draft ids (mass outside the draft vocabulary is dropped).
    ``features``: what the head reads, ``hidden`` (the final hidden state) or ``aux`` (EAGLE-3's layers)."""
    lens = [min(s.positions, max_len) for s in seqs]
    b, length, d = len(seqs), max(lens), seqs[0].hidden.shape[1]
    k = seqs[0].topk_ids.shape[1]
    dev = seqs[0].hidden.device  # built where the data lie: on a GPU, no copy per batch
    out = Batch(
        hidden=torch.zeros(b, length, features_of(seqs[0], features).shape[1], device=dev),
        next_hidden=torch.zeros(b, length, d, device=dev),
        next_tokens=torch.zeros(b, length, dtype=torch.long, device=dev),
        positions=torch.arange(length, device=dev).expand(b, length).clone(),
        label_ids=torch.zeros(b, length, k, dtype=torch.long, device=dev),
        label_p=torch.zeros(b, length, k, device=dev),
        greedy=torch.full((b, length), -1, dtype=torch.long, device=dev),
        valid=torch.zeros(b, length, dtype=torch.bool, device=dev),
        generated=torch.zeros(b, length, dtype=torch.bool, device=dev),
    )
    t2d = t2d.to(dev)
    for i, (s, n) in enumerate(zip(seqs, lens)):
        out.hidden[i, :n] = features_of(s, features)[:n].float()
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
        out.generated[i, :m] = torch.arange(1, m + 1, device=dev) >= s.gen_start
    return out


def features_of(s: Sequence, features: str) -> torch.Tensor:
    """A sequence's features of one kind ([n-1, F]); a clear error when its data were made without them."""
    t = getattr(s, features)
    if t is None:
        raise ValueError(f"these data hold no {features!r} features (made for another head architecture)")
    return t


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


# ==== a least-squares start =========================================================================
#
# A head that starts by repeating h_t (new_head) has everything to learn, and gradient descent on a
# CPU budget gets it little of the way (a 30-minute run on Qwen2.5-Coder-1.5B: 12 % first-position
# acceptance). Two closed-form fits start it as a good predictor instead, each a ridge regression
# onto the target's next hidden state h_{t+1} (divided by the final norm's scale, which the head's
# norm multiplies back), the regression target the lm_head turns into the target's distribution:
#
#   eh_proj   from the head's inputs [enorm(e_{t+1}), hnorm(h_t)]      (2d features)
#   down_proj from the MLP's intermediate activations, the layer's     (the target's last layer's
#             gate/up features of the residual stream, kept as they are  8960 features on the 1.5B)
#
# Measured on the 1.5B (73k training positions, 28 held-out prompts), greedy agreement at draft
# positions 1/2/3: h_t 0.6 %; after eh_proj 26/6/1 %; after down_proj 35/11/4 %, as much as the
# first 14 minutes of gradient training from eh_proj alone. Fitting o_proj the same way (on the
# attention's output) added under one point and is left to the gradient steps.


class _Normal:
    """The normal equations of a ridge regression, accumulated batch by batch (float64)."""

    def __init__(self, n_in: int, n_out: int, device):
        self.xtx = torch.zeros(n_in, n_in, dtype=torch.float64, device=device)
        self.xty = torch.zeros(n_in, n_out, dtype=torch.float64, device=device)
        self.y_sq, self.y_sum, self.count = 0.0, torch.zeros(n_out, dtype=torch.float64, device=device), 0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.float(), y.float()
        self.xtx.add_(x.T @ x)
        self.xty.add_(x.T @ y)
        self.y_sq += float(y.double().pow(2).sum())
        self.y_sum.add_(y.double().sum(0))
        self.count += len(y)

    def solve(self, ridge: float) -> tuple[torch.Tensor, float]:
        """(M [n_in, n_out] minimising ‖XM − Y‖² + λ‖M‖², λ = ridge × mean(diag XᵀX); R² on the data)."""
        lam = ridge * float(self.xtx.diagonal().mean())
        eye = torch.eye(self.xtx.shape[0], dtype=self.xtx.dtype, device=self.xtx.device)
        m = torch.linalg.solve(self.xtx + lam * eye, self.xty)
        # residual = Σy² − 2 tr(Mᵀ XᵀY) + tr(Mᵀ XᵀX M)
        resid = self.y_sq - 2 * float((m * self.xty).sum()) + float((m * (self.xtx @ m)).sum())
        total = self.y_sq - float(self.y_sum.pow(2).sum()) / max(1, self.count)
        return m, (1 - resid / total if total > 0 else float("nan"))


@torch.no_grad()
def fit_projection(head: DraftHead, seqs: list[Sequence], *, ridge: float = 1e-3, rows: int = 8192) -> float:
    """Set the head's input projection (the MTP head's ``eh_proj``, EAGLE-3's ``fc``) to the ridge
    regression of h_{t+1} on what it reads (see above); R²."""
    d = head.parts.hidden_size
    proj = head.projection
    dev = proj.weight.device
    w = norm_scale(head.norm).float().to(dev)
    normal = _Normal(proj.in_features, d, dev)
    pending: list[tuple[torch.Tensor, ...]] = []

    def flush():
        if pending:
            h, tok, pos, nxt = (torch.cat(t).to(dev) for t in zip(*pending))
            pending.clear()
            normal.add(head.projection_inputs(h[None], tok[None], pos[None])[0], nxt / w)

    held = 0
    for s in seqs:
        n = min(s.positions, len(s.tokens) - 1)
        if n < 2:
            continue
        feats = features_of(s, head.features)
        pending.append((feats[: n - 1].float(), s.tokens[1:n], torch.arange(n - 1), s.hidden[1:n].float()))
        held += n - 1
        if held >= rows:
            flush()
            held = 0
    flush()
    if normal.count == 0:
        return float("nan")
    m, r2 = normal.solve(ridge)
    proj.weight.copy_(m.T.to(proj.weight.dtype))
    return r2


def residual_output(head: DraftHead, name: str) -> torch.nn.Linear | None:
    """The layer's ``self_attn.o_proj`` / ``mlp.down_proj`` where it is a plain Linear (None otherwise:
    a mixture of experts, another naming)."""
    module = dict(head.layer.named_modules()).get(name)
    return module if isinstance(module, torch.nn.Linear) else None


@torch.no_grad()
def output_normal_equations(
    head: DraftHead,
    module: torch.nn.Linear,
    seqs: list[Sequence],
    t2d: torch.Tensor,
    *,
    batch_tokens: int = 2048,
    max_positions: int = 32768,
) -> _Normal:
    """The normal equations, on the inputs of ``module`` (a residual branch's output projection of
    the head's layer), of what the layer's output still misses of h_{t+1}: step 1 of the chain (a
    P-EAGLE head: its whole parallel pass, each mask position against the target's hidden state
    where it predicts), up to ``max_positions`` rows in a fixed shuffled order (those of an
    8960-wide MLP cost ~160 GFLOP per 1,000 positions). Solve them once per ridge strength."""
    dev = module.weight.device
    w = norm_scale(head.norm).float().to(dev)
    feats: list[torch.Tensor] = []
    hook = module.register_forward_pre_hook(lambda m, args: feats.append(args[0]))
    normal = _Normal(module.in_features, head.parts.hidden_size, dev)
    try:
        for group in batches(seqs, batch_tokens=batch_tokens, rng=random.Random(0)):
            b = collate(group, t2d, batch_tokens, features=head.features).to(dev)
            feats.clear()
            if head.arch == "peagle":  # block d, index i predicts where the real position i does: want h_{i+1}
                n = head.parallel_tokens
                out = torch.cat(parallel(head, b, n), dim=1)
                want = b.next_hidden.repeat(1, n, 1)
                keep = torch.cat([b.valid & (b.positions >= d) for d in range(n)], dim=1)
            else:
                mask = chain_mask(b.hidden.shape[1], 1, device=dev)
                out = head.layer_output(head.combine(b.hidden), b.next_tokens, b.positions, mask=mask)
                want, keep = b.next_hidden, b.valid
            normal.add(feats[-1][keep], want[keep] / w - out[keep].float())
            if normal.count >= max_positions:
                break
    finally:
        hook.remove()
    return normal


@torch.no_grad()
def fit_output(
    head: DraftHead,
    module: torch.nn.Linear,
    seqs: list[Sequence],
    t2d: torch.Tensor,
    *,
    ridge: float = 1e-3,
    batch_tokens: int = 2048,
    max_positions: int = 32768,
) -> float:
    """Add to ``module``'s weight the ridge solution of :func:`output_normal_equations`; R²."""
    normal = output_normal_equations(head, module, seqs, t2d, batch_tokens=batch_tokens, max_positions=max_positions)
    if normal.count == 0:
        return float("nan")
    m, r2 = normal.solve(ridge)
    module.weight.add_(m.T.to(module.weight.dtype))
    return r2


@torch.no_grad()
def mean_inputs(parts, seqs: list[Sequence], *, rows: int = 65536) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of the target's layer streams (``aux``) and of the next tokens' embeddings over the
    first ``rows`` positions of ``seqs``: a P-EAGLE head's mask position starts as this average one."""
    feats, emb, n = 0.0, 0.0, 0
    for s in seqs:
        m = min(s.positions, len(s.tokens) - 1, rows - n)
        if m <= 0:
            break
        feats = feats + features_of(s, "aux")[:m].float().sum(0)
        tokens = s.tokens[1 : m + 1].to(parts.embed.weight.device)
        emb = emb + parts.embed(tokens).float().sum(0)
        n += m
    if not n:
        raise ValueError("no positions in the data to start the mask position from")
    return feats / n, emb / n


def least_squares_start(head: DraftHead, seqs: list[Sequence], t2d: torch.Tensor, *, say=None) -> dict[str, float]:
    """The fits in order (the input projection: eh_proj or fc, then the MLP's down_proj); the R² of each.

    A P-EAGLE head also fits the attention's o_proj first, over its real and mask positions: its
    mask positions learn of the draft's context only through attention, and the start zeroes o_proj
    (a chained step reads the previous step's state directly, and there the fit gained under a point)."""
    out = {"eh_proj" if head.arch == "mtp" else "fc": fit_projection(head, seqs)}
    attn = residual_output(head, "self_attn.o_proj") if head.arch == "peagle" else None
    if attn is not None:
        out["self_attn.o_proj"] = fit_output(head, attn, seqs, t2d)
    mlp = residual_output(head, "mlp.down_proj")
    if mlp is not None:
        out["mlp.down_proj"] = fit_output(head, mlp, seqs, t2d)
    if say:
        say("least-squares start: " + ", ".join(f"{k} R² {v:.3f}" for k, v in out.items()))
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


def chain(head: DraftHead, batch: Batch, depth: int) -> list[torch.Tensor]:
    """The head's states [B, L, d] for chained steps 1 … depth (see the module docstring)."""
    cache = DynamicCache()
    outs: list[torch.Tensor] = []
    g = head.combine(batch.hidden)
    for d in range(1, depth + 1):
        if d > 1:
            g = torch.cat([torch.zeros_like(g[:, :1]), g[:, :-1]], dim=1)  # step d reads step d−1 at p−1
        mask = chain_mask(g.shape[1], d, device=g.device)
        g = head(g, batch.next_tokens, batch.positions, cache=cache, mask=mask)
        outs.append(g)
    return outs


def parallel_mask(length: int, depth: int, *, device=None) -> torch.Tensor:
    """Mask [1, 1, depth·L, depth·L] (True = may attend) of a P-EAGLE pass over L real positions and
    depth − 1 blocks of L mask positions (block d holds, at index i, mask d of the draft anchored at
    p = i − d). A real query i sees the real keys ≤ i; mask d of anchor p sees the real keys ≤ p and
    the masks 1 … d of its own anchor: what the head's cache holds when the engine drafts at p, and
    speculators' ``create_peagle_mask_mod``. Every query sees itself (no empty row for p < 0).

    >>> parallel_mask(3, 2)[0, 0].int().tolist()
    [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 0, 0], [1, 0, 0, 0, 1, 0], [1, 1, 0, 0, 0, 1]]
    """
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    rows = []
    for d in range(depth):
        blocks = [j <= i - d] + [(j == i - d + e) & (e <= d) for e in range(1, depth)]
        rows.append(torch.cat(blocks, dim=1))
    return torch.cat(rows, dim=0)[None, None]


def parallel(head: DraftHead, batch: Batch, depth: int) -> list[torch.Tensor]:
    """A P-EAGLE head's states [B, L, d] for draft tokens 1 … depth, in :func:`chain`'s layout (out[s][:, p + s]
    predicts token s + 1 of the draft anchored at p): one pass over the real positions and depth − 1
    blocks of mask positions (:func:`parallel_mask`), mask d of anchor p at position p + d."""
    b, length = batch.next_tokens.shape
    real = head.combine(batch.hidden)  # [B, L, d]
    hidden = torch.cat([real, head.mask_state().to(real.dtype).expand(b, (depth - 1) * length, -1)], dim=1)
    tokens = torch.cat([batch.next_tokens, torch.full((b, (depth - 1) * length), MASK, device=real.device)], dim=1)
    positions = batch.positions.repeat(1, depth)  # block d, index i: position i (= p + d)
    g = head(hidden, tokens, positions, mask=parallel_mask(length, depth, device=real.device))
    return list(g.split(length, dim=1))


def draft_states(head: DraftHead, batch: Batch, depth: int) -> list[torch.Tensor]:
    """The states of draft tokens 1 … depth as the head drafts them: chained, or in one pass (P-EAGLE)."""
    if head.arch == "peagle":
        return parallel(head, batch, min(depth, head.parallel_tokens))
    return chain(head, batch, depth)


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
    head: DraftHead, batch: Batch, depth: int, step_weight: float, hidden_weight: float = 0.0
) -> tuple[torch.Tensor, list[float]]:
    """The weighted loss over chained steps (soft cross-entropy, plus ``hidden_weight`` × the feature
    loss), and each step's cross-entropy; for a P-EAGLE head, over its parallel positions (all
    ``parallel_tokens`` of them, whatever ``depth``)."""
    outs = parallel(head, batch, head.parallel_tokens) if head.arch == "peagle" else chain(head, batch, depth)
    total, weights, parts = 0.0, 0.0, []
    for d, g in enumerate(outs, start=1):
        valid = batch.valid & (batch.positions >= d - 1)
        ce = soft_ce(head.logits(g), batch, valid)
        loss = ce + hidden_weight * hidden_mse(head.final_hidden(g), batch, valid) if hidden_weight else ce
        w = step_weight ** (d - 1)
        total = total + w * loss
        weights += w
        parts.append(float(ce.detach()))
    return total / weights, parts


# ==== evaluation ===================================================================================


@torch.inference_mode()
def evaluate(
    head: DraftHead,
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
    if full_vocab and head.lm_head is not None and head.arch == "mtp":  # what vLLM runs of the MTP head's export
        lm_head = head.parts.lm_head  # the target's, in the target's dtype (bf16 on a GPU, the head's float32 aside)
        scorers["_full_vocab"] = lambda g: lm_head(g.to(lm_head.weight.dtype)).argmax(-1)
    if head.arch == "peagle":
        k = min(k, head.parallel_tokens)  # it proposes no more than it was trained for
    accepted = {name: [0] * k for name in scorers}
    windows, loss_sum, loss_n = 0, 0.0, 0
    for group in batches(seqs, batch_tokens=batch_tokens, rng=random.Random(0)):
        b = collate(group, t2d, batch_tokens, features=head.features).to(device)
        with autocast():
            outs = draft_states(head, b, k)
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
