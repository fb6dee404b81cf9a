"""The q4 kernel (csrc/q4/q4.c, engine/q4.py): each output row computed by the same instructions
whatever the rows beside it, so verification logits equal plain one-row logits bit for bit.

The kernel half: random weights, every row count 1…8 (and a prefill's 40), every vector unit this
CPU has, each equal to the scalar path bit for bit; Q4_K tensors repacked exactly (gguf-py's own
de-quantization as the reference). The model half: tiny random Qwen2 and Llama targets, the
verification logits against row-by-row logits at every k and across key-block boundaries, as
tests/test_invariant.py checks the int8 target. CI sets VOCABBRIDGE_REQUIRE_Q4 so that a build
without the extension fails here instead of skipping.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from vocabbridge.engine import q4
from vocabbridge.engine.invariant import INVARIANT_ROWS, KEY_BLOCK, FusedPart

from .test_invariant import QWEN05, _lm, _tiny, worst_difference
from .test_real_models import PROMPTS, SMOL, need_model, smol  # noqa: F401  (the fixture)

if not q4.available():
    if os.environ.get("VOCABBRIDGE_REQUIRE_Q4"):
        pytest.fail(f"VOCABBRIDGE_REQUIRE_Q4 is set but vocabbridge._q4 was not built: {q4.BUILD_ERROR}", pytrace=False)
    pytest.skip(f"vocabbridge._q4 not built ({q4.BUILD_ERROR})", allow_module_level=True)

ext = q4.require()
UNITS = ext.supported()  # slowest first: scalar, avx2, avx512vnni, amx


@pytest.fixture
def unit():
    """Restores the fastest vector unit after a test that chose another."""
    yield
    ext.set_isa(UNITS[-1])


@pytest.fixture(autouse=True)
def _torch_threads():
    """An engine on the q4 target sets torch's threads to one for the process; later tests get theirs back."""
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_a_missing_extension_is_refused_with_the_fix(monkeypatch):
    from vocabbridge.errors import ConfigError

    monkeypatch.setattr(q4, "_ext", None)
    monkeypatch.setattr(q4, "BUILD_ERROR", "No module named 'vocabbridge._q4'")
    with pytest.raises(ConfigError, match="C compiler.*reinstall vocabbridge"):
        q4.require()


def _rows(R: int, K: int, seed: int, outliers: bool = True) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, K, generator=g) * torch.logspace(-3, 3, R)[:, None]  # rows of very different scales
    if outliers:
        x[:, :7] *= 40  # a few outlier channels, as real activations have
    return x


@pytest.mark.parametrize("shape", [(300, 64), (96, 256), (160, 576), (48, 1000), (1024, 1536)])
def test_every_row_count_gives_each_row_its_one_row_result(shape, unit):
    """Rows 1…8, 11, 12, 17 (and 40, a prefill chunk) beside each other: row i equals row i computed alone, on
    every vector unit, and every unit equals the scalar one bit for bit."""
    N, K = shape
    torch.manual_seed(0)
    w = q4.Q4Matrix.from_float(torch.randn(N, K) * 0.05)
    bias = torch.randn(N)
    x = _rows(40, K, seed=N)
    results = {}
    for name in UNITS:
        ext.set_isa(name)
        alone = torch.cat([q4.matmul(w, x[i : i + 1], bias) for i in range(40)])
        for R in (*range(1, 9), 11, 12, 17):  # 12 and more: the AMX unit's tiles, 17: two passes of them
            assert torch.equal(q4.matmul(w, x[:R], bias), alone[:R]), (name, R)
        assert torch.equal(q4.matmul(w, x, bias), alone), (name, 40)
        assert torch.equal(q4.matmul(w, x[3:8]), q4.matmul(w, x)[3:8]), name  # no bias, another window
        results[name] = alone
    for name in UNITS:
        assert torch.equal(results[name], results["scalar"]), name


def test_threads_do_not_change_results():
    torch.manual_seed(1)
    w = q4.Q4Matrix.from_float(torch.randn(208, 512))
    x = _rows(6, 512, seed=3)
    before = ext.threads()
    try:
        got = []
        for n in (1, 2, 3):
            ext.set_threads(n)
            got.append(q4.matmul(w, x))
    finally:
        ext.set_threads(before)
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])


@pytest.mark.parametrize("H, H_kv, d, L, R", [(12, 2, 128, 300, 5), (4, 4, 24, 37, 3), (6, 2, 20, 50, 8), (2, 1, 8, 1, 1)])
def test_attention_gives_each_row_its_own_result_close_to_sdpa(H, H_kv, d, L, R, unit):
    """The extension's attention: every query row equals the row alone over the keys up to its
    position, bit for bit, on every vector unit; and it is causal attention (torch's SDPA, 1e-6)."""
    g = torch.Generator().manual_seed(L)
    q, k, v = (
        torch.randn(1, H, R, d, generator=g),
        torch.randn(1, H_kv, L, d, generator=g),
        torch.randn(1, H_kv, L, d, generator=g),
    )
    out = q4.attention(None, q, k, v)[0]
    assert out.shape == (1, R, H, d)
    mask = torch.ones(R, L, dtype=torch.bool).tril(L - R)
    kk, vv = (t.repeat_interleave(H // H_kv, 1) for t in (k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q, kk, vv, attn_mask=mask).transpose(1, 2)
    assert (out - ref).abs().max() < 2e-6
    for r in range(R):
        n = L - R + r + 1
        assert torch.equal(q4.attention(None, q[:, :, r : r + 1], k[:, :, :n], v[:, :, :n])[0][:, 0], out[:, r]), r
    for u in UNITS:
        ext.set_isa(u)
        assert torch.equal(q4.attention(None, q, k, v)[0], out), u


def test_attention_refuses_a_bad_shape():
    with pytest.raises(ValueError, match="bad attention shape"):
        ext.attend(0, 0, 0, 0, 3, 4, 3, 8, 10, 1.0)  # 4 heads over 3 key heads
    with pytest.raises(ValueError, match="one sequence"):
        q4.attention(None, torch.randn(2, 2, 1, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8))


def test_results_are_close_to_the_float_layer():
    """4-bit weights (Q4_K, as llama.cpp quantizes) and int8 activations per 256 inputs."""
    torch.manual_seed(2)
    lin = torch.nn.Linear(1536, 256)
    ql = q4.Q4Linear.from_linear(lin)
    deq = ql.weight
    assert (deq - lin.weight).norm() / lin.weight.norm() < 0.1  # 4-bit weights
    with torch.inference_mode():
        for outliers, bound in ((False, 0.01), (True, 0.05)):  # int8 activations, one scale per 256 inputs
            x = _rows(5, 1536, seed=4, outliers=outliers)
            exact = torch.nn.functional.linear(x, deq, lin.bias)
            assert ((ql(x) - exact).norm(dim=1) / exact.norm(dim=1)).max() < bound, outliers
    assert torch.equal(ql(torch.zeros(2, 1536)), lin.bias.detach().expand(2, -1))  # a zero row: the bias, no NaN
    assert ql(x[None]).shape == (1, 5, 256)  # [B, S, in] in, [B, S, out] out


def _random_q4k(N: int, K: int, seed: int) -> np.ndarray:
    """Random GGUF Q4_K bytes [N, K/256 × 144] with sane scales (d, dmin in fp16, 12 bytes of 6-bit fields)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, size=(N * (K // 256), 144), dtype=np.uint8)
    blocks[:, 0:2] = np.frombuffer(rng.uniform(1e-4, 1e-3, len(blocks)).astype(np.float16).tobytes(), np.uint8).reshape(-1, 2)
    blocks[:, 2:4] = np.frombuffer(rng.uniform(1e-4, 1e-3, len(blocks)).astype(np.float16).tobytes(), np.uint8).reshape(-1, 2)
    return blocks.reshape(N, -1)


def test_q4k_tensors_repack_exactly():
    """A GGUF's Q4_K bytes go in as they are: the kernel's weights are gguf-py's de-quantization, to
    the bit, and a row order (llama's q/k permutation) is taken as given."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    N, K = 48, 512
    raw = _random_q4k(N, K, seed=5)
    reference = torch.from_numpy(dequantize(raw, GGMLQuantizationType.Q4_K).reshape(N, K).copy())
    assert torch.equal(q4.Q4Matrix.from_q4k(raw, N, K).dequantize(), reference)
    order = torch.randperm(N)
    assert torch.equal(q4.Q4Matrix.from_q4k(raw, N, K, order).dequantize(), reference[order])
    # found by content where the rows were permuted on their way into the model
    assert torch.equal(q4._exact_q4k(_OneTensor(raw), "w", reference[order]).dequantize(), reference[order])
    assert q4._exact_q4k(_OneTensor(raw), "w", reference + 1e-3) is None  # other values: not this tensor


class _OneTensor:
    def __init__(self, raw):
        self._raw = raw

    def raw(self, name):
        return self._raw


def test_quantizing_float_weights_matches_llama_cpp_q4k_error():
    """Weights quantized here land on Q4_K's grid: re-packing their own de-quantization is lossless-ish."""
    torch.manual_seed(6)
    w = torch.randn(64, 768) * 0.02
    m = q4.Q4Matrix.from_float(w)
    deq = m.dequantize()
    assert (deq - w).norm() / w.norm() < 0.1
    again = q4.Q4Matrix.from_float(deq).dequantize()
    assert (again - deq).norm() / deq.norm() < 0.02


# ==== the whole target: verification logits equal row-by-row logits ============================


@pytest.mark.parametrize(
    "kind, prompt_len, min_rows",
    [
        ("qwen2", 3, None),  # every forward padded to INVARIANT_ROWS
        ("qwen2", KEY_BLOCK - 1, 1),  # plain steps of one row, across the first key block's end
        ("qwen2", 2 * KEY_BLOCK + 5, 1),
        ("llama", KEY_BLOCK - 1, None),
        ("llama", 2 * KEY_BLOCK + 5, 1),
    ],
)
def test_q4_verification_equals_plain_rows_bit_for_bit(kind, prompt_len, min_rows):
    """k = 1…8 (k + 1 > INVARIANT_ROWS verifies in pieces), prompts and KV lengths across key blocks."""
    model = _tiny(kind)
    counts = q4.make_q4(model)
    assert counts["quantized"] == 2 * 7 + 1  # q/k/v, o, gate/up, down per layer, the lm_head
    assert isinstance(model.model.layers[0].self_attn.k_proj, FusedPart)
    assert isinstance(model.lm_head, q4.Q4Linear)
    lm = _lm(model, rows=INVARIANT_ROWS, min_rows=min_rows)
    for k in range(1, 9):
        assert worst_difference(lm, prompt_len, k) == 0.0, k


def test_q4_target_close_to_the_float_model():
    """The tiny Qwen2's greedy next tokens mostly agree with the fp32 model's (4-bit weights)."""
    ref = _tiny("qwen2")
    model = _tiny("qwen2")
    q4.make_q4(model)
    x = torch.randint(3, 300, (1, 64), generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        a = ref(input_ids=x).logits[0].argmax(-1)
        b = model(input_ids=x).logits[0].argmax(-1)
    assert (a == b).float().mean() > 0.6


# ==== the real model: every drafter gives the plain answer ======================================


@pytest.mark.slow
@pytest.mark.parametrize("drafter, mode", [("ngram", "auto"), ("suffix", "auto"), ("qwen", "text")])
def test_every_drafter_is_token_identical_on_the_q4_target(smol, drafter, mode):  # noqa: F811
    """SmolLM2-135M (its Q4_1 GGUF: every linear quantized here) as the q4 target, through the
    engine factory (--kernels q4): n-gram, suffix and a model drafter of another vocabulary."""
    from vocabbridge.engine import SamplingParams, SpecEngine
    from vocabbridge.engine.factory import build_engine
    from vocabbridge.spec import EngineSpec

    if drafter == "qwen":
        need_model(QWEN05)
    name = {"qwen": str(QWEN05)}.get(drafter, drafter)
    spec = EngineSpec(target=str(SMOL), drafter=name, mode=mode, kernels="q4", num_speculative_tokens=4)
    built = build_engine(spec, loaded=smol)
    assert isinstance(built.target.model.lm_head, q4.Q4Linear) and built.path.kernels == "q4"
    assert built.target.rows == INVARIANT_ROWS and built.target.min_rows in (1, INVARIANT_ROWS)
    plain = SpecEngine(built.target)
    params = SamplingParams(max_new_tokens=32)
    for p in PROMPTS:
        ids = built.target.view.encode(p)
        assert built.engine.generate(ids, params).tokens == plain.generate(ids, params).tokens, (drafter, mode, p)


@pytest.mark.slow
def test_real_gguf_verification_equals_plain_rows_bit_for_bit():
    """Qwen2.5-Coder-0.5B's GGUF (CI fetches it): its Q4_K tensors (half the ffn_down) repacked
    exactly, the rest quantized; verification logits equal row-by-row logits past a key block."""
    need_model(QWEN05)
    lm = q4.load_q4_lm(str(QWEN05))
    kinds = [type(m).__name__ for m in lm.model.modules()]
    assert "Linear" not in kinds and kinds.count("Q4Linear") == 24 * 4 + 1
    assert sum(m.exact for m in lm.model.modules() if isinstance(m, q4.Q4Linear)) == 12  # its Q4_K ffn_down
    for k in (1, 4, 7):
        assert worst_difference(lm, KEY_BLOCK + 20, k, steps=10, vocab=lm.vocab_size) == 0.0, k


def test_attention_reads_a_cache_with_room_and_fused_query_rows_in_place(unit):
    """attend(..., room, q_row): keys and values in a buffer longer than L, the queries inside a
    fused q/k/v row; the same bits as the contiguous call, on every vector unit."""
    H, H_kv, d, L, R, room = 6, 2, 24, 40, 4, 64
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, H, R, d, generator=g)
    k, v = torch.randn(1, H_kv, L, d, generator=g), torch.randn(1, H_kv, L, d, generator=g)
    want = q4.attention(None, q, k, v)[0][0]  # [R, H, d]
    kbuf, vbuf = torch.full((H_kv, room, d), float("nan")), torch.full((H_kv, room, d), float("nan"))
    kbuf[:, :L], vbuf[:, :L] = k[0], v[0]
    fused = torch.randn(R, (H + 2 * H_kv) * d, generator=g)  # q's heads first, as the fused matmul writes them
    fused[:, : H * d] = q[0].transpose(0, 1).reshape(R, H * d)
    for u in UNITS:
        ext.set_isa(u)
        out = torch.empty(R, H, d)
        ext.attend(
            fused.data_ptr(), kbuf.data_ptr(), vbuf.data_ptr(), out.data_ptr(), R, H, H_kv, d, L, d**-0.5, room, fused.shape[1]
        )
        assert torch.equal(out, want), u
    with pytest.raises(ValueError, match="bad attention shape"):
        ext.attend(0, 0, 0, 0, R, H, H_kv, d, L, 1.0, L - 1)  # less room than keys
