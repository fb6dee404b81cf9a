"""The q4 target: the int8 invariant target's forward (:mod:`.invariant`: the same norms and row plan)
with every linear on our own 4-bit CPU matmul and the attention on our own loop over the keys
(``vocabbridge._q4``, ``csrc/q4/q4.c``), torch's own ops on one thread (the kernels' pool has the cores).

Why a kernel of our own: on a CPU, speculative decoding pays only if a forward over k + 1 rows costs
little more than one row. A one-row forward reads every weight once; more rows need only more
arithmetic on weight blocks already in registers, if the kernel decodes each block once and applies
it to every row. llama.cpp's per-row dot products decode the block again for each row (five rows
cost ~3x one), fbgemm's int8 reads 1.5x the bytes of 4-bit weights. The kernel here keeps Q4_K's
values (a GGUF's Q4_K tensors are repacked exactly, other tensors quantized as llama.cpp quantizes
Q4_K), quantizes each activation row on its own to int8 per 256 inputs, sums the products in
integers and combines the blocks in one fixed float order per output element, so a row's result is
bit for bit the same whatever rows sit beside it, whichever thread computes it and whichever
vector unit (scalar, AVX2, AVX-512 VNNI, chosen at run time) runs it. Two threads (the caller and
one worker that spins briefly, then sleeps on a futex) split the output columns.

The extension is compiled by ``pip install`` (setup.py, the system's C compiler, no torch headers).
Where it could not be built, :func:`require` says how to fix it.

>>> lin = Q4Linear.from_linear(torch.nn.Linear(512, 48))  # doctest: +SKIP
>>> x = torch.randn(5, 512)  # doctest: +SKIP
>>> torch.equal(lin(x)[2], lin(x[2:3])[0])  # doctest: +SKIP
True
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import ConfigError
from .invariant import FUSE, FusedPart, files_fingerprint, register_attention

try:
    from .. import _q4 as _ext

    BUILD_ERROR = ""
except ImportError as e:  # built without a C compiler, or a checkout never installed
    _ext = None
    BUILD_ERROR = str(e)

ATTENTION = "vocabbridge_q4"
FORMAT = "2"  # bump when the packed layout or the quantizer changes (the cache key holds it)
INSTALL_HINT = (
    "--kernels q4 needs vocabbridge's compiled extension vocabbridge._q4 (csrc/q4/q4.c), which pip builds with the "
    "system's C compiler when it installs vocabbridge; it was not built here. Install a C compiler and Python's headers "
    "(Debian/Ubuntu: apt-get install gcc python3-dev), then reinstall vocabbridge (in a checkout: pip install --no-deps "
    "--force-reinstall -v -e . ; -v shows the compiler's messages); or use --kernels torch --dtype int8 or --kernels llama.cpp"
)


def require():
    """The compiled extension, or a :class:`ConfigError` that says how to build it."""
    if _ext is None:
        raise ConfigError(f"{INSTALL_HINT} ({BUILD_ERROR or 'not importable'}).")
    if not getattr(require, "checked", False):
        require.checked = True
        _self_check()
    return _ext


def _self_check() -> None:
    """Every vector unit of this CPU against the scalar path, bit for bit, once per process (a
    handful of small matmuls): a unit that disagrees (a compiler's or a CPU's fault) is not used."""
    units = _ext.supported()
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 700, generator=g)
    x = torch.randn(9, 700, generator=g) * 3
    m = Q4Matrix.empty(48, 700)
    _ext.pack_f32(w.data_ptr(), 48, 700, 0, m.data.data_ptr())

    def run(unit):
        _ext.set_isa(unit)
        y = torch.empty(9, 48)
        _ext.matmul(m.ptr, 48, 700, x.data_ptr(), 9, y.data_ptr(), 0)
        return y

    q, k, v = (torch.randn(s, generator=g) for s in [(4, 3, 24), (2, 37, 24), (2, 37, 24)])

    def attend(unit):
        _ext.set_isa(unit)
        out = torch.empty(3, 4, 24)
        _ext.attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), 3, 4, 2, 24, 37, 0.2)
        return out

    want, want_att = run("scalar"), attend("scalar")
    good = [u for u in units if torch.equal(run(u), want) and torch.equal(attend(u), want_att)]
    _ext.set_isa(good[-1])
    if good[-1] != units[-1]:
        import warnings

        warnings.warn(
            f"vocabbridge._q4: the {units[-1]} kernels disagree with the scalar ones here; using {good[-1]}", stacklevel=2
        )


def available() -> bool:
    return _ext is not None


def default_threads() -> int:
    """Threads splitting the columns: torch's intra-op count, within this process's CPUs."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cpus))


def set_threads(n: int | None = None) -> int:
    """Set the kernel's thread count (None: :func:`default_threads`); returns it."""
    n = n or int(os.environ.get("VOCABBRIDGE_Q4_THREADS", 0)) or default_threads()
    require().set_threads(n)
    return n


def vector_unit() -> str:
    """The vector unit the kernels run on here: ``amx`` (AVX-512 VNNI, AMX tiles from 12 rows), ``avx512vnni``, ``avx2`` or ``scalar``."""
    return require().isa()


# ==== packed matrices ==========================================================================


def _aligned(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A uint8 buffer and its 64-byte aligned view of ``nbytes``."""
    buf = torch.empty(nbytes + 64, dtype=torch.uint8)
    off = (-buf.data_ptr()) % 64
    return buf, buf[off : off + nbytes]


@dataclass(eq=False)
class Q4Matrix:
    """An [out, in] weight matrix packed for the kernel (``data``: 64-byte aligned uint8 bytes)."""

    data: torch.Tensor
    out_features: int
    in_features: int
    keep: torch.Tensor | None = None  # the buffer ``data`` views, kept alive

    @staticmethod
    def nbytes(out_features: int, in_features: int) -> int:
        return require().packed_size(out_features, in_features)

    @classmethod
    def empty(cls, out_features: int, in_features: int) -> Q4Matrix:
        buf, data = _aligned(_ext.packed_size(out_features, in_features) if _ext else cls.nbytes(out_features, in_features))
        return cls(data, out_features, in_features, buf)

    @classmethod
    def from_float(cls, weight: torch.Tensor) -> Q4Matrix:
        """Quantize float weights [out, in] as llama.cpp quantizes Q4_K (make_qkx2_quants)."""
        w = weight.detach().to(torch.float32).contiguous()
        m = cls.empty(*w.shape)
        require().pack_f32(w.data_ptr(), w.shape[0], w.shape[1], 0, m.data.data_ptr())
        return m

    @classmethod
    def from_q4k(cls, raw, out_features: int, in_features: int, rows: torch.Tensor | None = None) -> Q4Matrix:
        """Repack a GGUF Q4_K tensor exactly: ``raw`` its bytes [out, in/256 × 144] (numpy or torch),
        ``rows`` which source row each output takes (None: in order)."""
        if isinstance(raw, np.ndarray):  # a GGUF reader's memory map is read-only: torch wants a writable array
            raw = np.require(raw, np.uint8, ["C", "W"])
        raw = torch.as_tensor(raw).contiguous()
        if raw.dtype != torch.uint8 or raw.numel() != out_features * (in_features // 256) * 144:
            raise ValueError(f"not the bytes of a {out_features} x {in_features} Q4_K tensor: {tuple(raw.shape)} {raw.dtype}")
        perm = None if rows is None else rows.to(torch.int64).contiguous()
        m = cls.empty(out_features, in_features)
        require().pack_q4k(raw.data_ptr(), out_features, in_features, 0 if perm is None else perm.data_ptr(), m.data.data_ptr())
        return m

    @classmethod
    def concat(cls, parts: list[Q4Matrix]) -> Q4Matrix:
        """Matrices stacked along the outputs (each part's outputs a multiple of 16: groups stay whole)."""
        assert all(p.out_features % 16 == 0 for p in parts[:-1]) and len({p.in_features for p in parts}) == 1
        m = cls.empty(sum(p.out_features for p in parts), parts[0].in_features)
        start = 0
        for p in parts:
            m.data[start : start + p.data.numel()] = p.data
            start += p.data.numel()
        return m

    @property
    def ptr(self) -> int:
        return self.data.data_ptr()

    def dequantize(self) -> torch.Tensor:
        """The weights the kernel multiplies by, as floats [out, in] ((d·sc)·q − dmin·m, as gguf-py computes Q4_K)."""
        out = torch.empty(self.out_features, self.in_features)
        require().dequantize(self.ptr, self.out_features, self.in_features, out.data_ptr())
        return out


def matmul(w: Q4Matrix, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [R, in] float32 → [R, out]: each row quantized and computed on its own (see the module docstring)."""
    x = x.to(torch.float32).contiguous()
    R = x.shape[0]
    y = torch.empty(R, w.out_features)
    require().matmul(w.ptr, w.out_features, w.in_features, x.data_ptr(), R, y.data_ptr(), 0 if bias is None else bias.data_ptr())
    return y


class Q4Linear(torch.nn.Module):
    """A Linear on the q4 kernel: every output row depends on its own input row only, bit for bit.

    >>> lin = Q4Linear.from_linear(torch.nn.Linear(300, 40))  # doctest: +SKIP
    >>> x = torch.randn(4, 300)  # doctest: +SKIP
    >>> bool((lin(x)[1] == lin(torch.stack([torch.randn(300), x[1]]))[1]).all())  # doctest: +SKIP
    True
    """

    def __init__(self, weight: Q4Matrix, bias: torch.Tensor | None = None, *, exact: int = 0):
        super().__init__()
        self.packed = weight
        self.exact = exact  # how many of the linears stacked here are a GGUF's Q4_K bytes as they are
        self.in_features, self.out_features = weight.in_features, weight.out_features
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float().contiguous(), requires_grad=False)

    @classmethod
    def from_linear(cls, lin: torch.nn.Linear) -> Q4Linear:
        return cls(Q4Matrix.from_float(lin.weight.data), lin.bias.data if lin.bias is not None else None)

    @property
    def weight(self) -> torch.Tensor:
        """The 4-bit weights de-quantized [out, in] (what an MTP head drafting over this lm_head's rows reads)."""
        return self.packed.dequantize()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = matmul(self.packed, x.reshape(-1, self.in_features), self.bias)
        return y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


# ==== a model's linears: from a GGUF's Q4_K tensors where they are, else quantized ============


class GGUFQ4K:
    """A GGUF file's Q4_K tensors, found by the Hugging Face module name they load into."""

    def __init__(self, path: Path):
        from gguf import MODEL_ARCH_NAMES, GGMLQuantizationType, GGUFReader, get_tensor_name_map

        self.reader = GGUFReader(str(path))
        field = self.reader.fields["general.architecture"]
        arch_name = bytes(field.parts[field.data[0]]).decode()
        layers = next((int(f.parts[f.data[0]][0]) for k, f in self.reader.fields.items() if k.endswith(".block_count")), 0)
        arch = {v: k for k, v in MODEL_ARCH_NAMES.items()}.get(arch_name)
        self.names = get_tensor_name_map(arch, layers) if arch is not None else None
        self.tensors = {t.name: t for t in self.reader.tensors if t.tensor_type == GGMLQuantizationType.Q4_K}

    def raw(self, module_name: str):
        """The Q4_K bytes of the weight ``module_name`` loads (``model.layers.3.self_attn.q_proj``), or None."""
        if self.names is None:
            return None
        name = self.names.get_name(module_name)
        t = self.tensors.get(f"{name}.weight") if name else None
        return None if t is None else t.data


def _exact_q4k(gguf: GGUFQ4K | None, name: str, weight: torch.Tensor) -> Q4Matrix | None:
    """The GGUF's Q4_K tensor behind ``weight``, repacked, if its values are exactly ``weight``'s
    (rows matched by content: llama's q/k rows are permuted on their way into transformers)."""
    raw = gguf.raw(name) if gguf is not None else None
    N, K = weight.shape
    if raw is None or K % 256 or raw.size != N * (K // 256) * 144:
        return None
    m = Q4Matrix.from_q4k(raw, N, K)
    deq = m.dequantize()
    w = weight.detach().float()
    if torch.equal(deq, w):
        return m
    where = {bytes(deq[i].numpy().tobytes()): i for i in range(N)}
    rows = [where.get(bytes(w[i].numpy().tobytes())) for i in range(N)]
    if None in rows or len(set(rows)) != N:
        return None
    m = Q4Matrix.from_q4k(raw, N, K, torch.tensor(rows))
    return m if torch.equal(m.dequantize(), w) else None


def _linear_groups(model: torch.nn.Module) -> list[tuple[torch.nn.Module, tuple[str, ...]]]:
    """(parent, child names) for every linear to replace: q/k/v and gate/up together (one matmul
    over their stacked weights) where each part's outputs are a multiple of 16, else one by one."""
    groups = []
    for module in model.modules():
        children = dict(module.named_children())
        fused: set[str] = set()
        for names in FUSE:
            lins = [children.get(n) for n in names]
            if (
                all(type(x) is torch.nn.Linear for x in lins)
                and len({x.in_features for x in lins}) == 1
                and all(x.out_features % 16 == 0 for x in lins)
            ):
                groups.append((module, names))
                fused.update(names)
        groups += [(module, (n,)) for n, c in children.items() if type(c) is torch.nn.Linear and n not in fused]
    return groups


def quantize_model(model: torch.nn.Module, *, gguf: Path | None = None, cache: Path | None = None, say=None) -> dict:
    """Replace every ``nn.Linear`` (the lm_head included) by a :class:`Q4Linear`, q/k/v and gate/up
    fused; a GGUF's Q4_K tensors repacked exactly, the rest quantized. ``cache``: a folder keeping the
    packed weights (read if complete, else written). Returns counts: exact, quantized, cached."""
    names = {id(m): n for n, m in model.named_modules()}
    groups = _linear_groups(model)
    index = _read_cache(cache) if cache else None
    blob = torch.from_file(str(cache / "weights.bin"), size=index["bytes"], dtype=torch.uint8) if index else None
    reader = GGUFQ4K(gguf) if gguf is not None and index is None else None
    counts = {"exact": 0, "quantized": 0, "cached": 0}
    entries, pieces, offset = [], [], 0
    t0 = time.perf_counter()
    for parent, group in groups:
        lins = [getattr(parent, n) for n in group]
        key = f"{names[id(parent)]}.{'+'.join(group)}".lstrip(".")
        N, K = sum(x.out_features for x in lins), lins[0].in_features
        if index is not None:
            e = index["matrices"].get(key)
            if e is None or e["shape"] != [N, K]:
                raise ValueError(f"q4 cache {cache}: no matrix {key} of {N} x {K}; delete the folder to rebuild it")
            mat = Q4Matrix(blob[e["offset"] : e["offset"] + e["bytes"]], N, K, blob)
            exact = e.get("exact", 0)
            counts["cached"] += len(group)
        else:
            parts, exact = [], 0
            for n, lin in zip(group, lins):
                m = _exact_q4k(reader, f"{names[id(parent)]}.{n}".lstrip("."), lin.weight)
                counts["exact" if m is not None else "quantized"] += 1
                parts.append(m if m is not None else Q4Matrix.from_float(lin.weight.data))
                exact += m is not None
            mat = parts[0] if len(parts) == 1 else Q4Matrix.concat(parts)
            entries.append((key, N, K, offset, mat.data.numel(), exact))
            pieces.append(mat)
            offset += (mat.data.numel() + 63) // 64 * 64
        bias = None
        if any(x.bias is not None for x in lins):
            bias = torch.cat([x.bias.data.float() if x.bias is not None else torch.zeros(x.out_features) for x in lins])
        fused = Q4Linear(mat, bias, exact=exact)
        if len(group) == 1:
            setattr(parent, group[0], fused)
        else:
            shared, start = {}, 0
            for n, lin in zip(group, lins):
                setattr(parent, n, FusedPart(fused, start, start + lin.out_features, shared))
                start += lin.out_features
    if cache is not None and index is None:
        _write_cache(cache, entries, pieces, offset)
    if say and (counts["exact"] or counts["quantized"]):
        say(
            f"q4: {counts['exact']} linears repacked exactly from Q4_K, {counts['quantized']} quantized "
            f"in {time.perf_counter() - t0:.0f} s" + (f" (kept in {cache})" if cache else "")
        )
    return counts


def _read_cache(folder: Path) -> dict | None:
    try:
        index = json.loads((folder / "index.json").read_text())
    except (OSError, ValueError):
        return None
    ok = index.get("format") == FORMAT and (folder / "weights.bin").stat().st_size == index.get("bytes")
    return index if ok else None


def _write_cache(folder: Path, entries, pieces, total: int) -> None:
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        with open(tmp / "weights.bin", "wb") as f:
            for (_, _, _, offset, _, _), mat in zip(entries, pieces):
                f.seek(offset)
                f.write(memoryview(mat.data.numpy()))
            f.truncate(total)
        matrices = {k: {"shape": [N, K], "offset": o, "bytes": b, "exact": x} for k, N, K, o, b, x in entries}
        (tmp / "index.json").write_text(json.dumps({"format": FORMAT, "bytes": total, "matrices": matrices}))
        if _read_cache(folder) is None:
            shutil.rmtree(folder, ignore_errors=True)
            os.replace(tmp, folder)
    except OSError:
        pass  # a read-only cache: quantize again next time
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def cache_folder(source: str, model: torch.nn.Module) -> Path:
    """Where a model's packed weights are kept: keyed by its files, the format and its linears."""
    from ..mapping.cache import cache_root

    shapes = ";".join(f"{n}:{tuple(m.weight.shape)}" for n, m in model.named_modules() if type(m) is torch.nn.Linear)
    key = "|".join([files_fingerprint(source), FORMAT, type(model).__name__, shapes])
    return cache_root() / "q4" / f"{Path(source).stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def gguf_of(source: str) -> Path | None:
    """The GGUF file behind a source (a .gguf file, or a folder holding exactly one), or None."""
    path = Path(source).expanduser()
    if path.is_dir():
        ggufs = sorted(path.glob("*.gguf"))
        path = ggufs[0] if len(ggufs) == 1 else path
    return path if path.is_file() and path.suffix == ".gguf" else None


def attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs):
    """Causal attention for one sequence whose cache holds everything before the queries (the engine's
    sessions), on the extension's kernel: each query row and head computed on its own in one fixed
    order (``csrc/q4/q4.c``), so a row's result does not depend on the rows beside it, on the keys past
    its position, on the thread or on the vector unit. The q4 target's attention, a transformers
    attention function: query [1, H, q, d], key/value [1, H_kv, L, d] → [1, q, H, d]. Where the
    torch version (:func:`.invariant.invariant_attention`) pads the queries and keys to fixed shapes
    and runs a dozen small ops a layer (~17 ms of the 1.5B's one-row forward), this is a loop.

    >>> q, k, v = torch.randn(1, 4, 3, 16), torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)  # doctest: +SKIP
    >>> torch.equal(attention(None, q, k, v)[0][:, 2], attention(None, q[:, :, 2:], k, v)[0][:, 0])  # doctest: +SKIP
    True
    """
    B, H, R, d = query.shape
    H_kv, L = key.shape[1], key.shape[2]
    if B != 1:
        raise ValueError(f"the q4 attention runs one sequence at a time, got a batch of {B}")
    q = query[0].float().contiguous()
    k, v = key[0].float().contiguous(), value[0].float().contiguous()
    out = torch.empty(1, R, H, d)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(d)
    require().attend(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), R, H, H_kv, d, L, scale)
    return out.to(query.dtype), None


def make_q4(model: torch.nn.Module, *, source: str | None = None, cache: bool = True, say=None) -> dict:
    """Turn a loaded fp32 CPU model into the q4 target (in place): 4-bit linears, the row-invariant
    attention of the extension (:func:`attention`). ``source``: the model's file or folder (its
    GGUF's Q4_K tensors are used as they are; its packed weights are cached under it)."""
    require()
    set_threads()
    say = say or (lambda msg: print(f"vocabbridge: {msg}", file=sys.stderr, flush=True))
    folder = cache_folder(source, model) if source and cache else None
    counts = quantize_model(model, gguf=gguf_of(source) if source else None, cache=folder, say=say)
    name = register_attention(ATTENTION, attention)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(name)
    else:
        model.config._attn_implementation = name
    return counts


def int8_drafter_lean(model: torch.nn.Module):
    """An int8 drafter's forward: :mod:`.lean`'s (no transformers modules, the KV cache written in
    place, RMSNorm, RoPE and attention on the q4 extension's routines) over its row-int8 linears,
    where the model is a plain Llama / Qwen2 decoder and the extension is built; else None (the
    transformers forward over the same linears).

    Why row-int8 (:class:`.invariant.RowInt8Linear`) and not ``quantize_dynamic``: dynamic
    quantization scales all of a forward's rows by one activation scale, so the drafter's prompt
    prefill and its catch-up feeds (the accepted tokens, then its next draft) lost precision to the
    rows beside them. On the transplanted SmolLM2 (2 AVX2 cores, four ~1,100-token texts, top-1
    against the fp32 drafter; benchmarks/drafter_precision.py, results/2026-12-07-row-int8-drafter)
    a 240-token prefill agreed 36 % with one scale and 69 % with row scales, the one-row steps after
    it 57 % and 68 %, and a one-row step took 57 ms with one scale and 50 ms here (the q4 kernel's
    4 bits: 27 ms, 66 % and 59 %)."""
    from .lean import lean_decoder

    if not available():
        return None
    set_threads()
    return lean_decoder(model)


def load_q4_lm(
    source: str,
    *,
    tokenizer=None,
    threads: int | None = None,
    rows: int | None = None,
    lean: bool | None = None,
    drafter: bool = False,
):
    """The q4 target: a model file or folder loaded by :func:`.model.load_causal_lm` in fp32, its
    linears then on the q4 kernel and its attention invariant; verifications run at most ``rows``
    rows a forward (:data:`.invariant.INVARIANT_ROWS`), and a plain step is one row where the load
    probe (:func:`.invariant.probe_lone_rows`) finds one row computes as a batch row does.

    ``lean``: sessions run :mod:`.lean`'s forward (the same arithmetic without transformers'
    modules, the KV cache written in place: one row 78 -> 51 ms on the 1.5B, 2 AVX2 cores) where the model is a
    plain Llama / Qwen2 decoder; False keeps the transformers forward. None: True unless
    ``VOCABBRIDGE_Q4_LEAN=0``.

    ``drafter``: a drafter (``--drafter-dtype q4``), whose numerics never reach the output: no row
    limit and no load probe, a forward runs as many rows as it is fed."""
    from .invariant import INVARIANT_ROWS
    from .lean import lean_decoder
    from .model import load_causal_lm

    require()
    t0 = time.perf_counter()
    lm = load_causal_lm(source, tokenizer=tokenizer, dtype="float32", device="cpu", pack=False)
    set_threads(threads)
    make_q4(lm.model, source=lm.source)
    if lean is None:
        lean = os.environ.get("VOCABBRIDGE_Q4_LEAN", "1") != "0"
    lm.lean = lean_decoder(lm.model) if lean else None
    lm.torch_threads = 1  # the kernel's own threads do the work; see CausalLM.torch_threads
    if not drafter:
        lm.rows = rows or INVARIANT_ROWS
        lm.min_rows = 1 if _lone_rows_probed(lm) else lm.rows
    lm.load_seconds = time.perf_counter() - t0
    return lm


def _lone_rows_probed(lm) -> bool:
    """Whether the q4 target's plain steps may run one row (see :mod:`.invariant`)."""
    from .invariant import INVARIANT_ROWS, KEY_BLOCK, PROBE_CELLS, cpu_name, probe_cached, probe_lone_rows

    key = [
        "q4",
        files_fingerprint(lm.source),
        FORMAT,
        vector_unit(),
        torch.__version__,
        cpu_name(),
        f"{torch.get_num_threads()}/{require().threads()}",
        "lean" if lm.lean is not None else "transformers",
        f"rows {lm.rows} block {KEY_BLOCK} cells {PROBE_CELLS} v{INVARIANT_ROWS}",
    ]
    return probe_cached(key, lambda: probe_lone_rows(lm, most=lm.rows))
