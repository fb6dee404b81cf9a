"""Batch invariance by construction: a target whose every output row is the same bit for bit
whether the row was computed alone (plain decoding) or beside k draft rows (a verification).

Why it matters: speculative decoding is only lossless when the verification forward's logits for
a position equal what plain decoding would compute there. In fp32 the two differ by ~1e-5 (kernels
pick other blockings for other shapes), which rarely flips a greedy choice; on quantized kernels
the differences are far larger (llama.cpp's Q4_K matmuls: up to 0.5 in the logits here; fbgemm's
dynamic int8, which quantizes the activations with one scale per batch: several units), so a
speculative answer drifts from the plain one at the first near-tie.

The three pieces, each invariant on its own:

1. **The row count is bounded** (``CausalLM.rows``): a verification runs at most R rows a forward.
   Where a load-time probe (:func:`probe_lone_rows`) finds that a one-row forward computes each
   row as a batch of 2…R does, a plain step is one row (``CausalLM.min_rows = 1``); otherwise every
   decode-time forward is padded to R rows (after the real rows, where the causal mask hides it;
   its KV entries are cropped after), so every op sees the same shapes and no kernel choice
   depends on k. With the two pieces below the unpadded forward is invariant by construction in
   the linears and the attention; the probe covers what is not (a norm's reduction that a CPU
   splits across threads by shape), and on the 2-core AVX2 machine it found none: a plain step
   then costs 168 ms instead of the padded 235 on the 1.5B.
2. **Linears** (:class:`RowInt8Linear`): int8 weights, each activation row scaled by its own
   maximum, integer accumulation (exact in any order).
3. **Attention** (:func:`invariant_attention`): keys in blocks of ``KEY_BLOCK`` fixed by absolute
   position, each block computed with the same shapes whatever the cache's length, the blocks added
   in order; the masked keys add exact zeros.

Norms, RoPE and the MLP's activation are elementwise or per-row reductions of fixed length.
``tests/test_invariant.py`` checks the whole target on a real checkpoint: verification logits equal
row-by-row logits bit for bit across k, prompt lengths and key-block boundaries, and the naive
path (no padding, stock kernels) does not.
"""

from __future__ import annotations

import functools
import math

import torch

from .quant import quantize_int8

ATTENTION = "vocabbridge_invariant"
INVARIANT_ROWS = 5  # rows of every decode-time forward of an int8 target: k + 1 ≤ 5 verifies in one forward
KEY_BLOCK = 128  # attention runs over keys in blocks of this many, fixed by absolute position
PROBE_CELLS = 300  # the load probe's prompt: past two key blocks (and llama.cpp's 256-cell padding)


def probe_lone_rows(lm, *, most: int, cells: int = PROBE_CELLS) -> bool:
    """Whether ``most`` one-token forwards give, bit for bit, the logits of one forward over the
    same tokens with 2, 3, … ``most`` rows, after a ``cells``-token prompt: then a plain step need
    not be padded. ``lm``: any backend whose sessions have ``extend(tokens, keep)`` / ``truncate``
    and whose ``min_rows`` pads one-token forwards (set to 1, unpadded, while probed). A context
    too short for the probe answers no: the padded path is exact everywhere."""
    if lm.max_context < cells + most:
        return False
    before, lm.min_rows = lm.min_rows, 1
    s = lm.session()
    try:
        s.extend([(97 * i + 13) % lm.vocab_size for i in range(cells)])
        step = [11 + i for i in range(most)]
        rows = torch.cat([s.extend([t]) for t in step])
        for n in range(2, most + 1):
            s.truncate(cells)
            if not torch.equal(s.extend(step[:n], keep=n), rows[:n]):
                return False
        return True
    finally:
        del s
        lm.min_rows = before


def probe_cached(key: list[str], probe) -> bool:
    """``probe()``'s answer, measured once per ``key`` (what decides it: the model's files, the kernel
    library's version, the CPU, the thread count…) and kept in ``$VOCABBRIDGE_CACHE/invariance.json``."""
    import hashlib
    import json

    from ..mapping.cache import cache_root
    from ..util import atomic_write_text

    digest = hashlib.sha256("|".join(key).encode()).hexdigest()[:16]
    path = cache_root() / "invariance.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    if not isinstance(known.get(digest), bool):
        known[digest] = bool(probe())
        try:
            atomic_write_text(path, json.dumps(known, indent=1))
        except OSError:
            pass  # a read-only cache: measure again next time
    return known[digest]


def cpu_name() -> str:
    """The CPU's model name (part of a probe's cache key)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def files_fingerprint(source: str) -> str:
    """Names, sizes and mtimes of a model's files (a folder's or one file's), for a probe's cache key."""
    from pathlib import Path

    path = Path(source).expanduser()
    if not path.exists():
        return source  # a hub id: its revision is what the name says
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return ";".join(f"{p.resolve()}:{p.stat().st_size}:{int(p.stat().st_mtime)}" for p in files)


def row_plan(n: int, keep: int, *, most: int, least: int, chunk: int) -> list[tuple[int, int, int]]:
    """How a feed of ``n`` tokens runs as forwards of fixed shapes: ``(start, stop, pad)`` pieces.
    A verification (``keep > 1``: several positions' logits wanted) goes ``most`` rows at a time,
    any other feed (a prompt chunk, a plain step) ``chunk`` tokens at a time; a piece shorter than
    ``least`` rows is padded to it. Shared by the int8 target (most = least = rows) and llama.cpp's.

    >>> row_plan(7, 7, most=5, least=5, chunk=7), row_plan(1, 1, most=5, least=5, chunk=1)
    ([(0, 5, 0), (5, 7, 3)], [(0, 1, 4)])
    """
    size = most if keep > 1 else chunk
    return [(i, min(i + size, n), max(0, least - (min(i + size, n) - i))) for i in range(0, n, size)]


def _quantize_dynamic(module: torch.nn.Module) -> torch.nn.Module:
    """fbgemm's dynamic int8 linear, weights quantized per output channel."""
    return quantize_int8(module, per_channel=True)


class RowInt8Linear(torch.nn.Module):
    """A Linear on fbgemm's int8 kernels whose every output row depends on its own input row only.

    ``quantize_dynamic``'s linears quantize a batch's activations with one scale (from the batch's
    min and max), so a row's result changes with the rows beside it. Here each row is first divided
    by its own absolute maximum, and a fixed anchor row holding +1 and -1 joins the batch: the
    batch's min and max are then -1 and +1 for any rows, the activation scale and zero point are
    constants, and the int8 × int8 products are summed in int32, exactly, in any order. Scaling
    back by the row's maximum and adding the bias are elementwise. Weights are int8 per output
    channel. On a CPU a forward is bound by reading the weights (a quarter of fp32's bytes), and
    extra rows are nearly free: one to seven rows cost 63 → 76 ms for the 1.5B target's linears.

    >>> lin = RowInt8Linear(torch.nn.Linear(16, 4))
    >>> x = torch.randn(3, 16)
    >>> bool((lin(x)[1] == lin(torch.stack([torch.randn(16), x[1]]))[1]).all())
    True
    """

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        bare = torch.nn.Linear(lin.in_features, lin.out_features, bias=False)
        bare.weight.data = lin.weight.data.float()
        self.inner = _quantize_dynamic(torch.nn.Sequential(bare))[0]
        self.bias = None if lin.bias is None else torch.nn.Parameter(lin.bias.data.float(), requires_grad=False)
        anchor = torch.zeros(1, lin.in_features)
        anchor[0, 0], anchor[0, -1] = 1.0, -1.0
        self.register_buffer("anchor", anchor, persistent=False)

    @property
    def weight(self) -> torch.Tensor:
        """The int8 weights, de-quantized [out, in] (what an MTP head drafting over this lm_head's rows reads)."""
        return self.inner.weight().dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, self.in_features).float()
        scale = torch.linalg.vector_norm(rows, ord=math.inf, dim=-1, keepdim=True).clamp_min_(1e-30)
        y = self.inner(torch.cat([rows / scale, self.anchor]))[:-1]
        y = y * scale if self.bias is None else torch.addcmul(self.bias, y, scale)
        return y.reshape(*shape[:-1], self.out_features)


class FusedPart(torch.nn.Module):
    """One of several linears that read the same input (q/k/v, gate/up), run as one
    :class:`RowInt8Linear` over their stacked weights: the first call computes all of them, the
    others take their columns from it (same input tensor, compared by identity)."""

    def __init__(self, fused: RowInt8Linear, start: int, stop: int, shared: dict):
        super().__init__()
        self.fused, self.start, self.stop, self.shared = fused, start, stop, shared
        self.in_features, self.out_features = fused.in_features, stop - start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shared.get("x") is not x:
            self.shared.update(x=x, y=self.fused(x))
        return self.shared["y"][..., self.start : self.stop]


FUSE = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # Llama / Qwen / Mistral naming


def quantize_rows(model: torch.nn.Module) -> int:
    """Replace every ``nn.Linear`` (the lm_head included) by a :class:`RowInt8Linear`, fusing the
    ones that read the same input (q/k/v, gate/up) into one; returns how many linears were replaced."""
    n = 0
    for module in list(model.modules()):
        children = dict(module.named_children())
        for group in FUSE:
            lins = [children.get(name) for name in group]
            if all(type(x) is torch.nn.Linear for x in lins) and len({x.in_features for x in lins}) == 1:
                stacked = torch.nn.Linear(lins[0].in_features, sum(x.out_features for x in lins), bias=lins[0].bias is not None)
                stacked.weight.data = torch.cat([x.weight.data.float() for x in lins])
                if stacked.bias is not None:
                    biases = [x.bias.data.float() if x.bias is not None else torch.zeros(x.out_features) for x in lins]
                    stacked.bias.data = torch.cat(biases)
                fused, shared, start = RowInt8Linear(stacked), {}, 0
                for name, lin in zip(group, lins):
                    setattr(module, name, FusedPart(fused, start, start + lin.out_features, shared))
                    start += lin.out_features
                n += len(group)
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(module, name, RowInt8Linear(child))
                n += 1
    return n


def invariant_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Causal attention for one sequence whose cache holds everything before the queries (the
    engine's sessions): query ``i`` of ``q`` sits at position ``L - q + i`` and sees keys up to it.
    ``attention_mask`` is ignored (there is no padding inside a session).

    The keys are cut into blocks of ``KEY_BLOCK`` by absolute position (the last one padded with
    masked keys). Every block is computed with the same shapes, whatever the cache's length: its
    scores, their exponentials (after the row's maximum, which is exact in any order), its sum and
    its share of the output. The blocks are then added in order, by a sequential scan; blocks past
    a row's position add exact zeros. Fewer than ``INVARIANT_ROWS`` query rows (a plain step, a
    short verification) are padded to that many, so the matmuls' shapes, and with them the kernels'
    blocking, are the same for every decode-time forward (unpadded, a head size of 16 gave a row
    alone results 2e-7 away from the same row in a batch). So a row's result does not depend on how
    many keys or rows the forward holds. Shapes as transformers passes them: query [B, H, q, d], key/value
    [B, H_kv, L, d] → [B, q, H, d].
    """
    B, H, q, d = query.shape
    H_kv, L = key.shape[1], key.shape[2]
    groups = H // H_kv
    rows = max(q, INVARIANT_ROWS)  # a decode-time forward's queries padded to a fixed count: fixed matmul shapes
    if rows > q:
        query = torch.nn.functional.pad(query, (0, 0, 0, rows - q))
    M = groups * rows  # the query heads of one key head, side by side (no copy of the keys per head)
    nb = math.ceil(L / KEY_BLOCK)
    pad = nb * KEY_BLOCK - L
    if pad:
        key = torch.nn.functional.pad(key, (0, 0, 0, pad))
        value = torch.nn.functional.pad(value, (0, 0, 0, pad))
    k = key.float().reshape(B, H_kv, nb, KEY_BLOCK, d)
    v = value.float().reshape(B, H_kv, nb, KEY_BLOCK, d)
    qg = query.float().reshape(B, H_kv, 1, M, d)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    s = torch.matmul(qg, k.transpose(-1, -2)) * scale  # [B, H_kv, nb, M, KEY_BLOCK]
    s = s.masked_fill_(_future(L, q, rows, groups, nb), float("-inf"))
    e = torch.exp(s - s.amax(dim=(2, 4), keepdim=True))
    total = e.sum(-1, keepdim=True).cumsum(2)[:, :, -1]  # [B, H_kv, M, 1]
    out = torch.matmul(e, v).cumsum(2)[:, :, -1] / total  # [B, H_kv, M, d]
    out = out.reshape(B, H, rows, d)[:, :, :q].transpose(1, 2).contiguous()
    return out.to(query.dtype), None


@functools.lru_cache(maxsize=64)
def _future(L: int, q: int, rows: int, groups: int, nb: int) -> torch.Tensor:
    """[nb, groups*rows, KEY_BLOCK] bool: the keys each query row may not see (past its position;
    the ``rows - q`` padding rows after the real ones see every key, their results dropped)."""
    pos = torch.cat([torch.arange(L - q, L), torch.full((rows - q,), L - 1)]).repeat(groups)  # each row's position
    keys = torch.arange(nb * KEY_BLOCK).view(nb, 1, KEY_BLOCK)
    return keys > pos.view(1, -1, 1)


def _no_mask(*args, **kwargs):
    return None


def register_attention(name: str = ATTENTION, fn=invariant_attention) -> str:
    """Register an attention function for one engine session's sequence (:func:`invariant_attention`
    by default) with transformers, with no mask built for it; returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, fn)
    AttentionMaskInterface.register(name, _no_mask)
    return name


def make_invariant(model: torch.nn.Module) -> None:
    """Turn a loaded CPU model into the batch-invariant int8 target (in place)."""
    quantize_rows(model)
    name = register_attention()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
