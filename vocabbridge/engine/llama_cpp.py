"""Causal LMs on llama.cpp's CPU kernels (``llama-cpp-python``), behind the interface of
:mod:`.model` (``CausalLM`` / ``KVSession``): the GGUF file as it is (quantized weights, no fp32
copy), the KV cache in llama.cpp, rollback by removing KV cells.

**Batch invariance, measured.** llama.cpp computes a row differently depending on how many rows
its batch holds, so a verification forward over k+1 tokens can give logits that differ from k+1
one-token forwards: by up to 0.4-0.9 in the logits on Qwen2.5-Coder-1.5B Q4_K_M, enough to change
a greedy answer at a near-tie. Measured on this build (0.3.36, 2 threads), with the weight
repacking off and flash attention on, every batch of 2 to 7 rows computes each row bit for bit
the same, while 8 or more rows take other kernels; with repacking on, a row's place in its group
of four matters too; with flash attention off, attention differs at every row count. One row
alone is the subtle case: with an f16 KV cache, flash attention splits a lone query's keys across
the threads once they pass 256 cells, so its row differs from the same row in a batch; with a
bf16 (or q8_0) KV cache it takes the batch's path at every length (measured to 1,000 cells on an
AVX2 machine; logits within 0.9, mean 0.08, of the f16 cache's, greedy choice the same at 98.8 %
of the positions of a code text). So a batch-invariant model (``invariant=True``, the target)
loads without repacking, with flash attention and a bf16 KV cache, and *measures at load*
whether one-row forwards equal the rows of 2- to 7-row ones past 256 cells
(:func:`_probed`): if it does, a plain step is one row; if not (another CPU or
build), every one-token forward is padded to two rows (the padding sits at the next position,
hidden by the causal mask, its KV cell removed right after). Verification runs at most
``MAX_ROWS`` rows per forward. Prompt chunks run as they are: plain and speculative decoding
prefill the same prompt with the same chunks. ``tests/test_llama_cpp.py`` checks it on a real GGUF.

The price on a 2-core CPU: llama.cpp's quantized matmuls are bound by compute, not by reading the
weights, so a forward costs nearly one row's time per row (1.5B on the AVX2 machine: 66 ms for one
row, 110 for two, 207 for five; on the AVX-512 one: 52, 97, 171), and a draft pays only where
it is accepted often (prompt lookup on repeating text); the torch int8 target (:mod:`.invariant`)
amortizes rows better. On a CPU with more cores per request it would pay more.

Every session owns a llama.cpp context (its KV cache) taken from a per-model pool and returned,
cleared, when the session is dropped, so a new request does not pay for allocating one.

**Threads.** ``set_threads`` changes every context's thread count (:mod:`.threads` follows the free
cores with it). Whether a target's logits depend on the count is measured at load
(:func:`.threads.probe_thread_counts`): llama.cpp splits a matmul's output rows among the threads,
each dot product whole, and with the bf16 KV cache a lone query's attention is not split either.

>>> lm = load_llama_cpp_lm("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", invariant=True)  # doctest: +SKIP
>>> s = lm.session(); s.extend([1, 2, 3], keep=1).shape  # doctest: +SKIP
torch.Size([1, 151936])
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError, ModelLoadError, RequestError
from ..tokenizer import TokenizerView, load_tokenizer
from .invariant import PROBE_CELLS, cpu_name, files_fingerprint, probe_cached, probe_lone_rows, row_plan
from .model import CacheSession

INSTALL_HINT = (
    "the llama.cpp kernels need llama-cpp-python: pip install 'vocabbridge[llama]' "
    "(it builds llama.cpp from source; on x86-64 set CMAKE_ARGS='-DGGML_NATIVE=OFF -DGGML_AVX512=ON' "
    "where the CPU has AVX-512: the native build with AMX crashes in llama_decode)"
)
DEFAULT_CTX = 8192  # KV cells per session: ~230 MB of f16 KV for the 1.5B target
BATCH = 512  # tokens per llama_decode call (a longer prefill chunk is split)
MAX_ROWS = 7  # batches of 2 to 7 rows compute each row alike (measured; see above)
FLASH_ATTN_ON = 1  # llama_flash_attn_type: enabled (attention then takes each query row on its own)
KV_BF16 = 30  # ggml_type of the KV cache of an invariant model (f16's lone-row attention splits; see above)


def _llama():
    """The ``llama_cpp`` module (imported on first use: it loads a shared library), its log silenced."""
    try:
        import llama_cpp
    except ImportError as e:
        raise ConfigError(f"--kernels llama.cpp: {INSTALL_HINT} ({e}).") from e
    if not getattr(_llama, "ready", False):
        _llama.log_cb = llama_cpp.llama_log_callback(lambda level, text, user: None)  # kept: C holds the pointer
        if not os.environ.get("VOCABBRIDGE_LLAMA_LOG"):
            llama_cpp.llama_log_set(_llama.log_cb, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _llama.ready = True
    return llama_cpp


def system_info() -> str:
    """What the installed llama.cpp was built with (``AVX2 = 1 | AVX512 = 1 …``)."""
    return _llama().llama_print_system_info().decode().strip()


class NoHiddenStates:
    """Stands in for ``CausalLM.final_norm``: an MTP head needs the target's hidden states, which
    this backend does not hand out."""

    def register_forward_hook(self, *_):
        raise ConfigError(
            "an MTP head reads the target's hidden states, which the llama.cpp kernels do not expose; use --kernels torch."
        )


@dataclass(eq=False)
class LlamaCppLM:
    """A GGUF model loaded by llama.cpp. ``invariant``: decode-time forwards shaped so that each
    row's logits do not depend on the batch (the target; drafters need no such care)."""

    path: Path
    view: TokenizerView
    source: str
    vocab_size: int
    max_context: int
    invariant: bool
    threads: int
    ctx_size: int
    min_rows: int = 1  # one-token forwards are padded to this many rows (2 where one row computes apart)
    load_seconds: float = 0.0
    forwards: int = 0
    device: str = "cpu"
    dtype: str = "gguf"
    _model: object = field(default=None, repr=False)
    _pool: list = field(default_factory=list, repr=False)
    _contexts: list = field(default_factory=list, repr=False)  # every context made, pooled or in use
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def plain_rows(self) -> int:
        """The rows a plain one-token step runs: 1, or 2 where an invariant target's lone row computes apart."""
        return self.min_rows if self.invariant else 1

    final_norm = NoHiddenStates()

    def session(self) -> LlamaSession:
        return LlamaSession(self)

    def set_threads(self, n: int) -> None:
        """Run every forward from now on with ``n`` threads: the contexts made so far and new ones."""
        L = _llama()
        with self._lock:
            self.threads = n
            for ctx in self._contexts:
                L.llama_set_n_threads(ctx, n, n)

    # ---- contexts: one per session, pooled -------------------------------------------------

    def _acquire(self):
        with self._lock:
            if self._pool:
                return self._pool.pop()
        L = _llama()
        cp = L.llama_context_default_params()
        cp.n_ctx = self.ctx_size
        cp.n_batch = cp.n_ubatch = BATCH
        cp.n_seq_max = 1
        cp.no_perf = True
        if self.invariant:
            cp.flash_attn_type = FLASH_ATTN_ON
            cp.type_k = cp.type_v = KV_BF16
        with self._lock:  # made under the lock: a thread count set meanwhile reaches it
            cp.n_threads = cp.n_threads_batch = self.threads
            ctx = L.llama_init_from_model(self._model, cp)
            if not ctx:
                raise ModelLoadError(
                    f"{self.name}: llama.cpp could not create a context of {self.ctx_size} tokens (out of memory?)."
                )
            self._contexts.append(ctx)
        return ctx

    def _release(self, ctx) -> None:
        L = _llama()
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        with self._lock:
            self._pool.append(ctx)


class LlamaSession(CacheSession):
    """One request's KV cache in a llama.cpp context; ``ids`` are the tokens it holds, in order."""

    def __init__(self, lm: LlamaCppLM):
        self.lm = lm
        self.ctx = lm._acquire()
        self.mem = _llama().llama_get_memory(self.ctx)
        self.ids: list[int] = []
        self._batch = _llama().llama_batch_init(BATCH, 0, 1)
        weakref.finalize(self, _close, lm, self.ctx, self._batch)

    def extend(self, tokens: list[int], *, keep: int = 1, hidden: bool = False) -> torch.Tensor:
        """Feed ``tokens``; return float32 logits of the last ``keep`` positions: [keep, V]."""
        if hidden:
            NoHiddenStates().register_forward_hook()
        if not tokens:
            raise ValueError("extend() needs at least one token")
        if len(self.ids) + len(tokens) > self.lm.max_context:
            raise RequestError(
                f"context of {len(self.ids) + len(tokens)} tokens exceeds {self.lm.name}'s limit of "
                f"{self.lm.max_context} on the llama.cpp kernels; shorten the prompt or lower max_tokens "
                f"(or raise VOCABBRIDGE_LLAMA_CTX, {self.lm.ctx_size} now)."
            )
        n = len(tokens)
        inv = self.lm.invariant  # see the module docstring
        plan = row_plan(n, keep, most=MAX_ROWS if inv else BATCH, least=self.lm.min_rows if inv else 0, chunk=BATCH)
        out = []
        for start, stop, pad in plan:
            piece = tokens[start:stop]
            wanted = max(0, stop - max(start, n - keep))  # this piece's rows among the last `keep`
            out.append(self._decode(piece, list(range(len(piece) - wanted, len(piece))), pad))
            self.ids.extend(piece)
        self.lm.forwards += 1
        return torch.from_numpy(np.concatenate(out))

    def _decode(self, piece: list[int], want: list[int], pad: int) -> np.ndarray:
        L = _llama()
        b = self._batch
        p0 = len(self.ids)
        n = len(piece) + pad
        wanted = set(want)
        for i in range(n):
            b.token[i] = piece[i] if i < len(piece) else piece[-1]
            b.pos[i] = p0 + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i in wanted else 0
        b.n_tokens = n
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            L.llama_memory_seq_rm(self.mem, 0, p0, -1)
            raise RequestError(f"llama.cpp could not decode {n} tokens at position {p0} (llama_decode returned {rc}).")
        if pad:
            L.llama_memory_seq_rm(self.mem, 0, p0 + len(piece), -1)  # the padding's KV cells
        V = self.lm.vocab_size
        if not want:
            return np.empty((0, V), np.float32)
        ptr = L.llama_get_logits(self.ctx)  # the requested rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(len(want) * V,)).reshape(len(want), V).copy()

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` cached tokens (rollback after a rejection)."""
        if n < len(self.ids):
            _llama().llama_memory_seq_rm(self.mem, 0, n, -1)
            del self.ids[n:]


def _close(lm: LlamaCppLM, ctx, batch) -> None:
    L = _llama()
    L.llama_batch_free(batch)
    lm._release(ctx)


def gguf_file(source: str) -> Path:
    """The GGUF file behind a source (a .gguf path, or a folder holding exactly one)."""
    path = Path(source).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
    if path.is_file() and path.suffix == ".gguf":
        return path
    raise ModelLoadError(
        f"{source}: the llama.cpp kernels run GGUF files; pass a .gguf file (or set VOCABBRIDGE_MODELS so the "
        "presets resolve to their GGUF files), or use --kernels torch for a transformers checkpoint."
    )


def load_llama_cpp_lm(
    source: str,
    *,
    tokenizer: str | TokenizerView | None = None,
    invariant: bool = False,
    threads: int | None = None,
    ctx_size: int | None = None,
) -> LlamaCppLM:
    """Load a GGUF model on llama.cpp's CPU kernels (``invariant``: see :class:`LlamaCppLM`)."""
    path = gguf_file(source)
    L = _llama()
    t0 = time.perf_counter()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    mp.use_extra_bufts = not invariant  # weight repacking: faster, but a row's place in the batch then matters
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    if not model:
        raise ModelLoadError(f"{path}: llama.cpp could not load it (a truncated or corrupt GGUF file?).")
    vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    n_train = L.llama_model_n_ctx_train(model)
    ctx = ctx_size or int(os.environ.get("VOCABBRIDGE_LLAMA_CTX", DEFAULT_CTX))
    ctx = min(ctx, n_train) if n_train > 0 else ctx
    view = tokenizer if isinstance(tokenizer, TokenizerView) else load_tokenizer(tokenizer or str(path))
    lm = LlamaCppLM(
        path=path,
        view=view,
        source=source,
        vocab_size=vocab,
        max_context=ctx - 2,  # room for a padding row
        invariant=invariant,
        threads=threads or os.cpu_count() or 1,
        ctx_size=ctx,
        load_seconds=time.perf_counter() - t0,
        _model=model,
    )
    weakref.finalize(lm, _free_model, model, lm._pool, lm._contexts)
    if invariant:
        lm.min_rows = 1 if _probed(lm) else 2
    return lm


def _probed(lm: LlamaCppLM) -> bool:
    """Whether one-token forwards equal the rows of 2- to ``MAX_ROWS``-row ones past 256 cells
    (:func:`.invariant.probe_lone_rows`), measured once per model file, llama.cpp build, CPU, thread
    count and context settings (:func:`.invariant.probe_cached`): ~3 s for SmolLM2-135M, ~10 s for
    the 1.5B on 2 cores."""
    return probe_cached([*probe_key(lm), str(lm.threads)], lambda: probe_lone_rows(lm, most=MAX_ROWS))


def probe_key(lm: LlamaCppLM) -> list[str]:
    """What a load probe's answer on ``lm`` depends on, the thread count aside: the model file, the
    llama.cpp build, the CPU and the context settings."""
    return [
        "llama.cpp",
        files_fingerprint(str(lm.path)),
        _llama().__version__,
        system_info(),
        cpu_name(),
        f"kv {KV_BF16} fa {FLASH_ATTN_ON} rows {MAX_ROWS} cells {PROBE_CELLS}",  # what the probe ran with
    ]


def _free_model(model, pool: list, contexts: list) -> None:
    L = _llama()
    for ctx in pool:
        L.llama_free(ctx)
    pool.clear()
    contexts.clear()
    L.llama_model_free(model)
