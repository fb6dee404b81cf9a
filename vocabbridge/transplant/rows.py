"""The new embedding and lm_head rows, from a :class:`~.plan.RowPlan` and the drafter's matrices.

Copied and special rows are the drafter's own. A composed row is built from the rows of the drafter
pieces that spell the target token (``p1 … pn``), by the ``--init`` method:

=========== =============================== ===============================================
init        input row (what the drafter     output row (lm_head: how likely the drafter
            reads for the token)            finds the token next)
=========== =============================== ===============================================
``mean``    mean of the pieces' rows        mean of the pieces' rows (transplant-vocab with
                                            decay 1; TokenAdapt's subword composition)
``first``   mean                            the first piece's row (turboderp's Qwama: the
                                            drafter predicts a token by its first piece)
``decay:F`` mean                            Σ Fⁱ·row(pᵢ) / Σ Fⁱ (jukofyork's transplant-vocab:
                                            0 = first, 1 = mean)
``omp:K``   Σ cⱼ·row(aⱼ) over K anchor      the same over the target's lm_head rows
            tokens (copied ones), cⱼ found
            by orthogonal matching pursuit
            in the *target's* embedding
            space (mergekit's tokensurgeon)
=========== =============================== ===============================================

Empty rows (ids without bytes, padding rows) get the mean of all drafter rows.

>>> Init.parse("decay:0.5").weights(3).round(3).tolist()
[0.571, 0.286, 0.143]
>>> Init.parse("first").weights(3).tolist(), Init.parse("mean").ties_rows
([1.0, 0.0, 0.0], True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError
from .plan import COMPOSED, COPIED, EMPTY, SPECIAL, RowPlan

INIT_NAMES = ("mean", "first", "decay", "omp")
OMP_POOL = 64  # candidate anchors per token, by cosine similarity, that the pursuit chooses among
OMP_BATCH = 1024  # tokens per pursuit batch


@dataclass(frozen=True)
class Init:
    """A composition method: ``mean``, ``first``, ``decay:F`` (0 ≤ F ≤ 1) or ``omp:K`` (K anchors)."""

    name: str
    decay: float = 1.0
    k: int = 8

    @classmethod
    def parse(cls, text: str) -> Init:
        name, _, arg = text.partition(":")
        if name not in INIT_NAMES:
            raise ConfigError(
                f"--init {text!r}: use one of mean, first, decay:F (0 ≤ F ≤ 1, e.g. decay:0.5) or omp:K (e.g. omp:8)."
            )
        try:
            if name == "decay":
                f = float(arg) if arg else 0.5
                if not 0.0 <= f <= 1.0:
                    raise ValueError
                return cls("decay", decay=f)
            if name == "omp":
                k = int(arg) if arg else 8
                if not 1 <= k <= OMP_POOL:
                    raise ValueError
                return cls("omp", k=k)
        except ValueError:
            raise ConfigError(
                f"--init {text!r}: decay takes a factor in [0, 1] (decay:0.5), omp a number of anchors in 1..{OMP_POOL} (omp:8)."
            ) from None
        if arg:
            raise ConfigError(f"--init {text!r}: {name} takes no argument.")
        return cls(name, decay=0.0 if name == "first" else 1.0)

    def __str__(self) -> str:
        return {"decay": f"decay:{self.decay:g}", "omp": f"omp:{self.k}"}.get(self.name, self.name)

    @property
    def ties_rows(self) -> bool:
        """Whether the input and output rows come out the same from tied matrices (a tied drafter stays tied)."""
        return self.name in ("mean", "omp") or (self.name == "decay" and self.decay == 1.0)

    def weights(self, n: int) -> np.ndarray:
        """The output row's weights over ``n`` pieces (decay family; ``mean`` and ``first`` included)."""
        w = np.power(self.decay, np.arange(n, dtype=np.float64)) if self.decay < 1.0 else np.ones(n)
        if self.decay == 0.0:
            w = np.zeros(n)
            w[0] = 1.0
        return w / w.sum()


@dataclass
class NewRows:
    """The drafter's new matrices: [target rows, d] each; ``output`` None when input and output stay tied."""

    input: torch.Tensor
    output: torch.Tensor | None

    @property
    def tied(self) -> bool:
        return self.output is None


def _mix(plan: RowPlan, ids: list[int], weights_of, source: torch.Tensor) -> torch.Tensor:
    """[len(ids), d]: for each composed target id, Σ w·source[piece], as one sparse product."""
    rows, cols, vals = [], [], []
    for r, t in enumerate(ids):
        p = plan.pieces[t]
        w = weights_of(len(p))
        rows.extend([r] * len(p))
        cols.extend(p)
        vals.extend(w.tolist())
    idx = torch.tensor([rows, cols], dtype=torch.long)
    shape = (len(ids), source.shape[0])
    m = torch.sparse_coo_tensor(idx, torch.tensor(vals, dtype=source.dtype), shape, check_invariants=False).coalesce()
    return torch.sparse.mm(m, source)


def build_rows(
    plan: RowPlan,
    emb_in: torch.Tensor,
    emb_out: torch.Tensor | None,
    *,
    init: Init | str = "mean",
    target_emb: tuple[torch.Tensor, torch.Tensor | None] | None = None,
    untie: bool = False,
) -> NewRows:
    """The new rows for ``plan``. ``emb_in``/``emb_out``: the drafter's [drafter rows, d] matrices
    (``emb_out`` None or the same tensor when tied). ``target_emb``: the target's (input, output or
    None when tied) matrices, which ``omp`` needs. ``untie``: give the output its own matrix even
    where the method would keep a tied drafter tied."""
    init = Init.parse(init) if isinstance(init, str) else init
    tied = emb_out is None or emb_out is emb_in or emb_out.data_ptr() == emb_in.data_ptr()
    src_in = emb_in.detach().float()
    src_out = src_in if tied else emb_out.detach().float()
    keep_tied = tied and not untie and init.ties_rows and (init.name != "omp" or target_emb is None or target_emb[1] is None)
    rows, d = plan.target.rows, src_in.shape[1]
    new_in = torch.empty(rows, d)
    new_out = None if keep_tied else torch.empty(rows, d)
    copy_ids = np.flatnonzero(np.isin(plan.kind, (COPIED, SPECIAL)))
    t_idx, d_idx = torch.from_numpy(copy_ids), torch.from_numpy(plan.source[copy_ids])
    new_in[t_idx] = src_in[d_idx]
    if new_out is not None:
        new_out[t_idx] = src_out[d_idx]
    empty = torch.from_numpy(plan.rows_of(EMPTY))
    new_in[empty] = src_in.mean(0)
    if new_out is not None:
        new_out[empty] = src_out.mean(0)
    ids = plan.rows_of(COMPOSED).tolist()
    if ids:
        t_ids = torch.tensor(ids)
        if init.name == "omp":
            if target_emb is None:
                raise ConfigError(
                    "--init omp finds each new token's anchors in the target's embedding space, so it needs the target's "
                    "weights (a model folder, a .gguf file or a hub id), not only its tokenizer; or use --init mean."
                )
            t_in, t_out = target_emb
            new_in[t_ids] = omp_rows(plan, ids, t_in, src_in, k=init.k)
            if new_out is not None:
                new_out[t_ids] = omp_rows(plan, ids, t_out if t_out is not None else t_in, src_out, k=init.k)
        else:
            new_in[t_ids] = _mix(plan, ids, Init("mean").weights, src_in)
            if new_out is not None:
                new_out[t_ids] = _mix(plan, ids, init.weights, src_out)
    return NewRows(new_in, new_out)


# ==== orthogonal matching pursuit ==================================================================


def omp_rows(plan: RowPlan, ids: list[int], target_matrix: torch.Tensor, drafter_matrix: torch.Tensor, *, k: int) -> torch.Tensor:
    """[len(ids), d_drafter]: each target token's row in the target's matrix approximated by ``k``
    copied tokens' rows there (greedy orthogonal matching pursuit among its ``OMP_POOL`` most similar
    copied tokens, least-squares coefficients), the same combination taken of the drafter's rows."""
    anchors = plan.rows_of(COPIED)
    anchors = anchors[anchors < target_matrix.shape[0]]
    if len(anchors) < k:
        raise ConfigError(f"--init omp:{k}: only {len(anchors)} tokens are copied, too few anchors; use --init mean.")
    a_t = target_matrix[torch.from_numpy(anchors)].float()  # [A, D]
    a_d = drafter_matrix[torch.from_numpy(plan.source[anchors])].float()  # [A, d]
    a_unit = a_t / a_t.norm(dim=1, keepdim=True).clamp_min(1e-8)
    out = torch.empty(len(ids), drafter_matrix.shape[1])
    for s in range(0, len(ids), OMP_BATCH):
        chunk = torch.tensor(ids[s : s + OMP_BATCH])
        x = target_matrix[chunk].float()  # [b, D]
        idx, coef = pursue(x, a_t, a_unit, k=k)
        out[s : s + len(chunk)] = torch.einsum("bk,bkd->bd", coef, a_d[idx])
    return out


def pursue(x: torch.Tensor, anchors: torch.Tensor, unit: torch.Tensor, *, k: int, pool: int = OMP_POOL):
    """Greedy OMP for a batch: ``x`` [b, D] over ``anchors`` [A, D] (``unit``: the same, unit length).
    Returns (anchor indices [b, k], coefficients [b, k]).

    >>> a = torch.eye(4)
    >>> idx, c = pursue(torch.tensor([[2.0, 0.0, 1.0, 0.0]]), a, a, k=2, pool=4)
    >>> sorted(zip(idx[0].tolist(), c[0].round(decimals=3).tolist()))
    [(0, 2.0), (2, 1.0)]
    """
    b = x.shape[0]
    cand = (x @ unit.T).abs().topk(min(pool, unit.shape[0]), dim=1).indices  # [b, P]
    c_vec, c_unit = anchors[cand], unit[cand]  # [b, P, D]
    chosen = torch.zeros(b, 0, dtype=torch.long)
    taken = torch.zeros(cand.shape, dtype=torch.bool)
    resid, coef = x, torch.zeros(b, 0)
    rows = torch.arange(b)
    for _ in range(k):
        score = torch.einsum("bd,bpd->bp", resid, c_unit).abs().masked_fill(taken, -1.0)
        pick = score.argmax(1)  # [b]
        taken[rows, pick] = True
        chosen = torch.cat([chosen, pick[:, None]], 1)
        basis = c_vec[rows[:, None], chosen]  # [b, j, D]
        coef = torch.linalg.lstsq(basis.transpose(1, 2), x[:, :, None]).solution[:, :, 0]  # [b, j]
        resid = x - torch.einsum("bj,bjd->bd", coef, basis)
    return cand.gather(1, chosen), coef
