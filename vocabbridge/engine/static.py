"""A target on a GPU, exact and fast: a static KV cache, every decode-time forward over the same
number of rows, and that forward replayed as a CUDA graph.

**Exact.** On a GPU, bf16 matmul and attention kernels pick their tiling by shape, so a position
computed as one row of a (k + 1)-row verification can differ from the same position computed
alone, and a near-tie flips a greedy token (measured on an H200: ``generate --compare-plain`` with
an MTP head was not identical). Here every decode-time forward of an invariant model runs exactly
``rows`` query rows (the real ones, then copies of the last, whose cache entries sit past the real
positions, hidden by the causal mask and overwritten later) against the whole static cache
(``max_len`` keys, those not yet written masked out): every kernel sees the same shapes whatever k
is, so a row's result depends only on its own inputs. Masked keys add exact zeros. Prompt prefills
run as they come, in chunks: plain and speculative decoding prefill the same prompt alike.

**Fast.** Eager decoding of a small model on a GPU is a chain of tiny kernel launches (SmolLM2-135M
ran at 15.6 tok/s on an H200, ~64 ms a token). With fixed shapes and static buffers the step is
captured once as a CUDA graph and replayed: one launch. Each session holds a cache slot (its K/V
buffers and the graphs captured on them) taken from a per-model pool and returned when the session
is dropped, so a new request does not capture again.

Supported: decoder stacks of the Llama family (Llama, Qwen2, Qwen3 with its q/k norms, Mistral
without a sliding window), which covers the GGUF checkpoints here; other architectures keep the
transformers path (:class:`~.model.KVSession`), where ``--dtype float32`` is the exact fallback.
On a CPU the same code runs without graphs (the tests check it there against transformers).

>>> lm = static_lm(load_causal_lm("qwen.gguf", device="cuda"), rows=8, invariant=True)  # doctest: +SKIP
>>> s = lm.session(); s.extend(prompt); s.extend([tok], keep=1)  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import RequestError
from .model import CacheSession, CausalLM

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
PREFILL_CHUNK = 512  # prompt tokens per eager prefill forward
STATIC_ROWS = 8  # rows of every decode-time forward of a GPU target (k ≤ 7 verifies in one forward)
MAX_LEN = 16384  # keys of a session's static cache at most (the 1.5B: 460 MB a session)
LEAST_KEYS = 1024  # a forward attends over the first 1024, 2048, … keys of the cache, as few as its rows need


def supported(lm: CausalLM) -> str | None:
    """None when ``lm`` can run on the static path, else why not."""
    cfg = lm.model.config
    kind = getattr(cfg, "model_type", "")
    if kind not in SUPPORTED:
        return f"model type {kind!r} is not one of {', '.join(SUPPORTED)}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", kind == "mistral"):
        return "a sliding-window attention"
    layer = lm.decoder.layers[0]
    if not all(hasattr(layer, a) for a in ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")):
        return "an unfamiliar decoder layer"
    return None


@dataclass
class Slot:
    """One session's cache: K and V per layer, [kv_heads, max_len, head_dim], and the CUDA graphs
    captured on them (keyed by (rows, what the step returns))."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    graphs: dict = field(default_factory=dict)


class StaticLM(CausalLM):
    """A :class:`~.model.CausalLM` whose sessions run on a static cache (see the module docstring).
    ``rows``: decode-time forwards run this many rows (an invariant model pads every one to it; any
    other runs 1 … rows as they come, each shape graphed); ``max_len``: the cache's keys."""

    static_rows: int
    max_len: int
    least_keys: int
    invariant: bool
    graphs: bool

    @classmethod
    def wrap(
        cls,
        lm: CausalLM,
        *,
        rows: int,
        invariant: bool,
        max_len: int | None = None,
        graphs: bool | None = None,
        least_keys: int = LEAST_KEYS,
    ):
        out = cls.__new__(cls)
        out.__dict__.update(lm.__dict__)
        out.static_rows = rows
        out.max_len = max_len or min(lm.max_context, MAX_LEN)
        out.max_context = out.max_len - rows  # room for the padding rows at the end
        out.least_keys = least_keys
        out.invariant = invariant
        out.rows = rows if invariant else None
        out.min_rows = rows if invariant else None
        out.graphs = lm.device.startswith("cuda") if graphs is None else graphs
        out._pool = []
        out._layers = _Layers(lm)
        return out

    def keys(self, end: int) -> int:
        """The cache keys a forward whose last row sits at ``end − 1`` attends over (:func:`keys_for`)."""
        return keys_for(end, least=self.least_keys, most=self.max_len)

    def session(self) -> StaticSession:
        slot = self._pool.pop() if self._pool else self._new_slot()
        s = StaticSession(self, slot)
        weakref.finalize(s, self._pool.append, slot)
        return s

    def _new_slot(self) -> Slot:
        L = self._layers
        shape = (L.kv_heads, self.max_len, L.head_dim)
        dev, dt = L.device, L.dtype
        return Slot(
            [torch.zeros(shape, device=dev, dtype=dt) for _ in L.layers],
            [torch.zeros(shape, device=dev, dtype=dt) for _ in L.layers],
        )


class _Layers:
    """The model's parts the static forward runs (transformers' own modules, called directly)."""

    def __init__(self, lm: CausalLM):
        base = lm.decoder
        self.embed = lm.model.get_input_embeddings()
        self.layers = list(base.layers)
        self.norm = base.norm
        self.rotary = base.rotary_emb
        self.lm_head = lm.model.get_output_embeddings()
        attn = self.layers[0].self_attn
        cfg = lm.model.config
        self.head_dim = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.scaling = getattr(attn, "scaling", self.head_dim**-0.5)
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        w = self.embed.weight
        self.device, self.dtype = w.device, w.dtype
        self.qk_norm = hasattr(attn, "q_norm")


def keys_for(end: int, *, least: int, most: int) -> int:
    """The cache keys a forward ending at position ``end`` attends over: a power of two, at least
    ``least``, at most ``most`` (the slot's length). A row's result does not depend on how many
    masked keys follow its own (measured on an H200 for SDPA's kernels: bit for bit from 1,024 to
    16,384 keys), and attending over 1,024 keys instead of 16,384 saves 8.6 ms a step on the 1.5B.

    >>> keys_for(10, least=1024, most=16384), keys_for(1500, least=1024, most=16384), keys_for(9000, least=1024, most=4096)
    (1024, 2048, 4096)
    """
    return min(most, max(least, 1 << max(0, end - 1).bit_length()))


def _forward(
    L: _Layers, slot: Slot, ids: torch.Tensor, pos: torch.Tensor, *, keep: int, aux: tuple[int, ...], final: bool, S: int
):
    """One forward over ``ids`` [T] at positions ``pos`` [T] (writing their K/V into ``slot``) with
    attention over the cache's first ``S`` keys: the logits of the last ``keep`` rows [keep, V]
    (float32), and the features asked for."""
    T = ids.shape[0]
    x = L.embed(ids)[None]  # [1, T, d]
    cos, sin = L.rotary(x, pos[None])
    mask = torch.arange(S, device=ids.device)[None, :] <= pos[:, None]  # [T, S]: the keys each row sees
    streams = []
    for i, layer in enumerate(L.layers):
        if i in aux:
            streams.append(x)
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(1, T, L.heads, L.head_dim).transpose(1, 2)
        k = a.k_proj(h).view(1, T, L.kv_heads, L.head_dim).transpose(1, 2)
        v = a.v_proj(h).view(1, T, L.kv_heads, L.head_dim).transpose(1, 2)
        if L.qk_norm:
            q, k = a.q_norm(q), a.k_norm(k)
        q, k = L.rope(q, k, cos, sin)
        slot.k[i].index_copy_(1, pos, k[0])
        slot.v[i].index_copy_(1, pos, v[0])
        o = F.scaled_dot_product_attention(
            q,
            slot.k[i][None, :, :S],
            slot.v[i][None, :, :S],
            attn_mask=mask[None, None],
            scale=L.scaling,
            enable_gqa=L.kv_heads != L.heads,
        )
        x = x + a.o_proj(o.transpose(1, 2).reshape(1, T, -1))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    if len(L.layers) in aux:
        streams.append(x)
    y = L.norm(x)
    logits = L.lm_head(y[0, T - keep :]).float()
    feats = torch.cat(streams, dim=-1)[0] if aux else (y[0] if final else None)
    return logits, feats


class StaticSession(CacheSession):
    """One request on a :class:`StaticLM`: ``ids`` are the tokens the cache holds."""

    def __init__(self, lm: StaticLM, slot: Slot):
        self.lm, self.slot = lm, slot
        self.ids: list[int] = []

    @torch.inference_mode()
    def extend(self, tokens: list[int], *, keep: int = 1, hidden: bool | tuple[int, ...] = False):
        """As :meth:`~.model.KVSession.extend`: float32 logits of the last ``keep`` fed positions, and
        with ``hidden`` the final hidden states (True) or the layer streams (a tuple) of every fed one."""
        if not tokens:
            raise ValueError("extend() needs at least one token")
        n, R, lm = len(tokens), self.lm.static_rows, self.lm
        if len(self.ids) + n > lm.max_context:
            raise RequestError(
                f"context of {len(self.ids) + n} tokens exceeds {lm.name}'s limit of {lm.max_context}; "
                "shorten the prompt or lower max_tokens."
            )
        aux = hidden if isinstance(hidden, tuple) else ()
        final = hidden is True
        if not self.ids or (n > R and keep == 1):  # a prompt: eager chunks, the same in plain and speculative runs
            logits, feats = self._prefill(tokens, keep, aux, final)
            self.ids.extend(tokens)
        else:  # decode-time: pieces of at most R rows (a verification longer than R: several)
            logits, feats = [], []
            for i in range(0, n, R):
                piece = tokens[i : i + R]
                want = max(0, i + len(piece) - (n - keep))  # this piece's rows among the last `keep`
                lg, ft = self._step(piece, want, aux, final)
                self.ids.extend(piece)
                logits.append(lg)
                feats.append(ft)
            logits = torch.cat(logits)
            feats = torch.cat(feats) if feats[0] is not None else None
        lm.forwards += 1
        return (logits, feats.float()) if hidden else logits

    def _prefill(self, tokens, keep, aux, final):
        L, dev = self.lm._layers, self.lm._layers.device
        logits, feats, start = [], [], len(self.ids)
        for i in range(0, len(tokens), PREFILL_CHUNK):
            piece = tokens[i : i + PREFILL_CHUNK]
            want = max(0, i + len(piece) - (len(tokens) - keep))  # this piece's rows among the last `keep`
            ids = torch.tensor(piece, device=dev)
            pos = torch.arange(start + i, start + i + len(piece), device=dev)
            S = self.lm.keys(start + i + len(piece))
            lg, ft = _forward(L, self.slot, ids, pos, keep=max(want, 1), aux=aux, final=final, S=S)
            if want:
                logits.append(lg[-want:])
            if ft is not None:
                feats.append(ft)
        return torch.cat(logits), (torch.cat(feats) if feats else None)

    def _step(self, tokens, keep, aux, final):
        """One decode-time forward of ``tokens`` (≤ rows): logits of its last ``keep`` rows, features of all."""
        n, lm = len(tokens), self.lm
        rows = lm.static_rows if lm.invariant else n
        padded = tokens + tokens[-1:] * (rows - n)
        p0 = len(self.ids)
        S = lm.keys(p0 + rows)
        if lm.graphs:
            logits, feats = self._replay(padded, p0, rows, aux, final, S)
        else:
            dev = lm._layers.device
            pos = torch.arange(p0, p0 + rows, device=dev)
            logits, feats = _forward(
                lm._layers, self.slot, torch.tensor(padded, device=dev), pos, keep=rows, aux=aux, final=final, S=S
            )
        return logits[n - keep : n].clone(), (feats[:n].clone() if feats is not None else None)

    def _replay(self, padded, p0, rows, aux, final, S):
        key = (rows, aux, final, S)
        g = self.slot.graphs.get(key)
        if g is None:
            g = self.slot.graphs[key] = _Graph(self.lm._layers, self.slot, rows, aux, final, S)
        return g(padded, p0)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens: later cache entries are simply masked (positions past the
        session's length are never attended to) and overwritten by what comes next."""
        del self.ids[n:]


class _Graph:
    """One decode step of ``rows`` rows on one slot, captured as a CUDA graph with static inputs."""

    def __init__(self, L: _Layers, slot: Slot, rows: int, aux: tuple[int, ...], final: bool, S: int):
        dev = L.device
        self.ids = torch.zeros(rows, dtype=torch.long, device=dev)
        end = slot.k[0].shape[1]
        self.pos = torch.arange(end - rows, end, device=dev)  # warm-up and capture write past any session's tokens
        run = lambda: _forward(L, slot, self.ids, self.pos, keep=rows, aux=aux, final=final, S=S)  # noqa: E731
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):  # warm-up outside the graph (allocations, library handles)
            for _ in range(2):
                run()
        torch.cuda.current_stream(dev).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = run()
        # the warm-up and the capture wrote K/V at the cache's last positions, which hold no session's
        # tokens (max_context leaves them free) and are rewritten before any row reads them

    def __call__(self, padded: list[int], p0: int):
        self.ids.copy_(torch.tensor(padded), non_blocking=True)
        self.pos.copy_(torch.arange(p0, p0 + len(padded)), non_blocking=True)
        self.graph.replay()
        return self.out


def static_lm(lm: CausalLM, *, rows: int, invariant: bool, graphs: bool | None = None) -> StaticLM | CausalLM:
    """``lm`` on the static path where its architecture allows, else ``lm`` as it is."""
    return StaticLM.wrap(lm, rows=rows, invariant=invariant, graphs=graphs) if supported(lm) is None else lm
