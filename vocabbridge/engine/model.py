"""Causal LMs behind one small interface: load any transformers model (folder, hub id, GGUF file),
keep a KV cache per request, extend it, roll it back.

A ``KVSession`` knows exactly which token ids its cache holds (``ids``), so rollback is a crop
and re-synchronisation with a new context is "crop to the common prefix, feed the rest".

>>> lm = load_causal_lm("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")  # doctest: +SKIP
>>> s = lm.session()  # doctest: +SKIP
>>> logits = s.extend([1, 2, 3], keep=1)  # [1, V], only the last position's logits  # doctest: +SKIP
>>> s.truncate(2); s.ids  # doctest: +SKIP
[1, 2]
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache

from ..errors import ConfigError, ModelLoadError, RequestError

with warnings.catch_warnings():  # torch.utils.mkldnn's ScriptModules warn that script_method is deprecated
    warnings.simplefilter("ignore", DeprecationWarning)
    from torch.utils.mkldnn import MkldnnLinear
from ..tokenizer import TokenizerView, load_tokenizer
from ..tokenizer.loaders.hub import hub_model_kwargs
from ..util import common_prefix_len
from .convert import converted_folder
from .invariant import make_invariant, quantize_rows, row_plan
from .quant import quantize_int8

DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
}


QUANTIZED = ("int8", "int8-dynamic")


def drafter_dtype_for(requested: str, device: str, target_dtype: str) -> str:
    """A drafter's dtype: ``auto`` is int8 dynamic quantization on the CPU (2-3× faster drafting; a
    drafter's numerics never change the output), the target's dtype elsewhere.

    >>> drafter_dtype_for("auto", "cpu", "float32"), drafter_dtype_for("auto", "cuda", "bfloat16")
    ('int8', 'bfloat16')
    """
    if requested in (*QUANTIZED, "q4") and not device.startswith("cpu"):
        what = "our q4 kernels run" if requested == "q4" else "dynamic int8 quantization runs"
        raise ConfigError(
            f"--drafter-dtype {requested}: {what} on the CPU only; on {device} use "
            "--drafter-dtype auto (the target's dtype) or bfloat16."
        )
    if requested != "auto":
        return requested
    return "int8" if device == "cpu" else target_dtype


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """``auto``: bf16 on CUDA, fp32 on CPU (see :func:`load_causal_lm` for why)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype in QUANTIZED:  # fp32 activations, int8 weights (quantized after loading)
        return torch.float32
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of auto, {', '.join([*DTYPES, *QUANTIZED])}") from None


def resolve_device(device: str | None) -> str:
    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def _load_weights(source: str, dtype: torch.dtype, device: str, *, cache_converted: bool):

    path = Path(source).expanduser()
    kwargs = {"dtype": dtype}
    if path.is_file() and path.suffix == ".gguf":
        if cache_converted:  # converted once into an HF folder (engine/convert.py), then loaded in seconds
            return AutoModelForCausalLM.from_pretrained(str(converted_folder(path)), **kwargs)
        return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **kwargs)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return _load_weights(str(ggufs[0]), dtype, device, cache_converted=cache_converted)
            raise ModelLoadError(f"{path}: no config.json (and not exactly one .gguf file); pass a model folder or a .gguf file.")
        return AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    if path.exists():
        raise ModelLoadError(f"{source}: not a model folder or a .gguf file.")
    return AutoModelForCausalLM.from_pretrained(source, **kwargs, **hub_model_kwargs(source))  # hub id: cached only, offline


class PackedLinear(torch.nn.Module):
    """nn.Linear with its weight pre-packed for oneDNN (fp32, CPU).

    Stock fp32 ``nn.Linear`` re-packs the weight on every multi-row call, so on a CPU a forward
    over k+1 positions costs about twice a one-token forward. With the weight packed once, one
    token costs about half as much as before and k+1 positions barely more (measured on the
    1.5B target: 0.38 → 0.20 s for 1 token, 0.78 → 0.35 s for 5). Results stay fp32-exact to
    ~1e-5, so greedy decisions match the unpacked model.
    """

    def __init__(self, lin: torch.nn.Linear):
        super().__init__()

        self.inner = MkldnnLinear(lin, torch.float32)
        self.in_features, self.out_features = lin.in_features, lin.out_features

    @property
    def weight(self) -> torch.Tensor:  # shape queries (vocab size) keep working
        return self.inner.weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = self.inner(x.reshape(-1, shape[-1]).contiguous())
        return y.reshape(*shape[:-1], self.out_features)


def pack_linears(model: torch.nn.Module) -> int:
    """Replace every fp32 ``nn.Linear`` of a CPU model by a :class:`PackedLinear`; returns how many."""
    if not torch.backends.mkldnn.is_available():
        return 0
    n = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is torch.nn.Linear and child.weight.dtype == torch.float32 and child.weight.device.type == "cpu":
                setattr(module, name, PackedLinear(child))
                n += 1
    return n


@dataclass
class CausalLM:
    """A loaded model with its tokenizer view. ``vocab_size`` is the logits' width."""

    model: object
    view: TokenizerView
    source: str
    device: str
    dtype: torch.dtype
    vocab_size: int
    max_context: int
    load_seconds: float = 0.0
    forwards: int = field(default=0)  # every forward call, for stats
    rows: int | None = None  # at most this many rows a verification forward (batch invariance; see KVSession.extend)
    min_rows: int | None = None  # decode-time forwards padded to this many rows (None: to ``rows``; 1: unpadded)
    # torch's intra-op threads while this model computes (None: as set). The q4 target runs its small
    # torch ops on one: torch's OpenMP threads spin after every op and took the core the q4 kernel's
    # worker needed (the 1.5B's one-row forward 156 ms with 2, 98 ms with 1, on 2 cores).
    torch_threads: int | None = None
    # the q4 target's own forward (engine/lean.py's LeanDecoder: no transformers modules, a KV cache
    # written in place); None: sessions run the transformers model
    lean: object | None = None

    @property
    def plain_rows(self) -> int:
        """The rows a plain one-token step runs: 1, or the padding batch invariance needs."""
        return (self.min_rows or self.rows) if self.rows else 1

    @property
    def cache_kwarg(self) -> str:
        """``cache`` in recent transformers, ``past_key_values`` before."""

        if not hasattr(self, "_cache_kwarg"):
            params = inspect.signature(self.model.forward).parameters
            self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        return self._cache_kwarg

    def session(self) -> KVSession:
        return self.lean.session(self) if self.lean is not None else KVSession(self)

    @functools.cached_property
    def decoder(self) -> torch.nn.Module:
        """The decoder stack (``layers`` and the final ``norm``), inside a multimodal wrapper too."""
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        return getattr(base, "language_model", base) if not hasattr(base, "norm") else base

    @property
    def final_norm(self) -> torch.nn.Module:
        """The decoder's final norm (its output is what the lm_head reads: an MTP head's input)."""
        return self.decoder.norm

    @property
    def name(self) -> str:
        return Path(self.source).name or self.source


@contextlib.contextmanager
def torch_threads(n: int | None):
    """torch's intra-op thread count set to ``n`` inside, restored after (None: left alone)."""
    before = torch.get_num_threads()
    if not n or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def _quiet_progress():
    """transformers' progress bars (GGUF de-quantization, checkpoint shards) only on a terminal:
    in logs and captured stderr their carriage returns are thousands of lines of noise."""
    if sys.stderr.isatty():
        yield
        return
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    gguf_utils = sys.modules.get("transformers.modeling_gguf_pytorch_utils") or importlib.import_module(
        "transformers.modeling_gguf_pytorch_utils"
    )
    gguf_tqdm = getattr(gguf_utils, "tqdm", None)  # the GGUF de-quantization bar is a plain tqdm
    if gguf_tqdm is not None:
        gguf_utils.tqdm = functools.partial(gguf_tqdm, disable=True)
    try:
        yield
    finally:
        if gguf_tqdm is not None:
            gguf_utils.tqdm = gguf_tqdm
        if bars:
            transformers.utils.logging.enable_progress_bar()


def load_causal_lm(
    source: str,
    *,
    tokenizer: str | TokenizerView | None = None,
    dtype: str | torch.dtype | None = "auto",
    device: str | None = "auto",
    cache_converted: bool = True,
    threads: int | None = None,
    pack: bool = True,
    rows: int | None = None,
) -> CausalLM:
    """Load a causal LM and its tokenizer view from a folder, a hub id or a GGUF file.

    ``dtype="auto"`` is bf16 on CUDA and fp32 on CPU: CPU bf16 kernels are not batch-invariant
    (a 5-token forward's logits differ from five 1-token forwards' by up to 0.25), which would
    make speculative output drift from plain greedy at near-ties; fp32 keeps them equal.
    ``pack`` pre-packs fp32 linear weights for oneDNN on CPU (see :class:`PackedLinear`).
    """
    device = resolve_device(device)
    dt = resolve_dtype(dtype, device)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    try:
        with _quiet_progress():
            model = _load_weights(source, dt, device, cache_converted=cache_converted)
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{source}: transformers could not load the model: {e}") from e
    model.to(device)
    model.eval()
    vocab = model.get_output_embeddings().weight.shape[0]
    if dtype in QUANTIZED:
        if device != "cpu":
            raise ModelLoadError("dtype int8 (dynamic quantization) runs on the CPU only; use bfloat16 on CUDA.")
        if rows is not None:  # a target: batch-invariant int8 linears and attention, forwards padded to `rows`
            make_invariant(model)
        elif dtype == "int8":  # a drafter: each row's activations scaled on their own (see q4.int8_drafter_lean)
            quantize_rows(model)
        else:  # int8-dynamic: one activation scale for all a forward's rows (the drafters' int8 before)
            model = quantize_int8(model)
    elif pack and device == "cpu" and dt == torch.float32:
        pack_linears(model)
    if isinstance(tokenizer, TokenizerView):
        view = tokenizer
    else:
        view = load_tokenizer(tokenizer or source)
    cfg = model.config
    text_cfg = getattr(cfg, "get_text_config", lambda: cfg)()
    max_ctx = int(getattr(text_cfg, "max_position_embeddings", 0) or 1 << 30)
    lm = CausalLM(model, view, source, device, dt, vocab, max_ctx, time.perf_counter() - t0, rows=rows)
    if rows is not None and dtype in QUANTIZED:
        lm.min_rows = 1 if _lone_rows_probed(lm) else rows
    return lm


def _lone_rows_probed(lm: CausalLM) -> bool:
    """Whether the invariant int8 target's plain steps may run one row (see :mod:`.invariant`)."""
    from .invariant import INVARIANT_ROWS, KEY_BLOCK, PROBE_CELLS, cpu_name, files_fingerprint, probe_cached, probe_lone_rows

    key = [
        "torch-int8",
        files_fingerprint(lm.source),
        torch.__version__,
        cpu_name(),
        str(torch.get_num_threads()),
        f"rows {lm.rows} block {KEY_BLOCK} cells {PROBE_CELLS} v{INVARIANT_ROWS}",
    ]

    return probe_cached(key, lambda: probe_lone_rows(lm, most=lm.rows))


@contextlib.contextmanager
def capture_streams(base: torch.nn.Module, layers: tuple[int, ...]):
    """While inside, ``streams()`` returns the residual streams entering ``layers`` of the decoder stack
    ``base`` (its ``layers`` and final ``norm``) in its last forward, concatenated: [B, S, len(layers)·d]
    (None without layers). Layer index ``len(base.layers)`` is the final norm's input."""
    seen: dict[int, torch.Tensor] = {}

    def keep(i):
        def hook(module, args, kwargs):
            seen[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    n = len(base.layers)
    handles = [(base.layers[i] if i < n else base.norm).register_forward_pre_hook(keep(i), with_kwargs=True) for i in layers]
    try:
        yield (lambda: torch.cat([seen[i] for i in layers], dim=-1)) if layers else (lambda: None)
    finally:
        for h in handles:
            h.remove()


class CacheSession:
    """What every session over a model's KV cache shares: ``ids`` (the tokens the cache holds, in
    order), ``extend`` and ``truncate`` (defined by each backend), and ``sync`` on top of them."""

    ids: list[int]

    def __len__(self) -> int:
        return len(self.ids)

    def extend(self, tokens: list[int], *, keep: int = 1, hidden: bool | tuple[int, ...] = False):
        raise NotImplementedError

    def truncate(self, n: int) -> None:
        raise NotImplementedError

    def sync(self, want: list[int], *, keep: int = 1) -> torch.Tensor:
        """Make the cache hold exactly ``want``: crop to the common prefix, feed the rest.

        Returns the logits of the last ``keep`` fed positions (at least one token is fed).
        """
        n = common_prefix_len(self.ids, want)
        if n == len(want):  # nothing new: re-feed the last token to get its logits
            n -= 1
        self.truncate(n)
        return self.extend(want[n:], keep=keep)


class KVSession(CacheSession):
    """One request's KV cache over a model; ``ids`` are the tokens the cache holds, in order."""

    def __init__(self, lm: CausalLM):

        self.lm = lm
        self.cache = DynamicCache()
        self.ids: list[int] = []

    @torch.inference_mode()
    def extend(self, tokens: list[int], *, keep: int = 1, hidden: bool | tuple[int, ...] = False):
        """Feed ``tokens``; return float32 logits of the last ``keep`` positions: [keep, V].

        ``hidden=True`` returns ``(logits, hidden)``, hidden being the final hidden state (after the
        final norm: what the lm_head reads) of every fed position, [len(tokens), d], from the same
        forward: what an MTP head drafts from. ``hidden=(i, j, …)`` returns instead the residual
        streams entering layers i, j, … (the layer count: the final norm's input), concatenated,
        [len(tokens), m·d]: what an EAGLE-3 head drafts from.
        """
        if not tokens:
            raise ValueError("extend() needs at least one token")
        if len(self.ids) + len(tokens) > self.lm.max_context:
            raise RequestError(
                f"context of {len(self.ids) + len(tokens)} tokens exceeds {self.lm.name}'s limit of "
                f"{self.lm.max_context}; shorten the prompt or lower max_tokens."
            )
        R, n = self.lm.rows, len(tokens)
        plan = row_plan(n, keep, most=R, least=self.lm.min_rows or R, chunk=n) if R else [(0, n, 0)]  # see CausalLM.rows
        logits, hiddens = [], []
        for start, stop, pad in plan:
            piece = tokens[start:stop]
            wanted = max(0, stop - max(start, n - keep))  # this piece's rows among the last `keep`
            lg, hd = self._forward(piece + piece[-1:] * pad, max(1, wanted + pad), hidden)
            if pad:
                self.cache.crop(-pad)  # the padding's KV entries
            self.ids.extend(piece)
            logits.append(lg[len(lg) - wanted - pad : len(lg) - pad])
            hiddens.append(hd[: len(piece)] if hd is not None else None)
        self.lm.forwards += 1
        logits = logits[0] if len(logits) == 1 else torch.cat(logits)  # [keep, V]; one piece: no 600 KB copy (0.4 ms)
        return (logits, torch.cat(hiddens)) if hidden else logits

    def _forward(self, tokens: list[int], keep: int, hidden) -> tuple[torch.Tensor, torch.Tensor | None]:
        with torch_threads(self.lm.torch_threads):
            return self._run(tokens, keep, hidden)

    def _run(self, tokens: list[int], keep: int, hidden) -> tuple[torch.Tensor, torch.Tensor | None]:
        x = torch.tensor([tokens], dtype=torch.long, device=self.lm.device)  # [1, S]
        kv = {self.lm.cache_kwarg: self.cache}
        seen: list[torch.Tensor] = []  # the final norm's output, caught on its way to the lm_head
        hook = self.lm.final_norm.register_forward_hook(lambda m, i, o: seen.append(o)) if hidden is True else None
        try:
            with capture_streams(self.lm.decoder, hidden if isinstance(hidden, tuple) else ()) as streams:
                out = self.lm.model(input_ids=x, use_cache=True, logits_to_keep=keep, **kv)
                feats = seen[-1] if hidden is True else streams()
        finally:
            if hook is not None:
                hook.remove()
        return out.logits[0, -keep:].float(), (feats[0].float() if feats is not None else None)

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens (rollback after a rejection)."""
        drop = len(self.ids) - n
        if drop > 0:
            self.cache.crop(-drop)  # negative = remove that many (works across transformers versions)
            del self.ids[n:]
