"""The q4 target's lean forward (engine/lean.py): each row its one-row bits at every row count, the
transformers q4 forward's results within RMSNorm's rounding, and a preallocated KV cache that crops
and grows as the engine's sessions need. Tiny random Qwen2 and Llama targets, and the real 0.5B GGUF."""

from __future__ import annotations

import pytest
import torch

from vocabbridge.engine import lean, q4
from vocabbridge.engine.invariant import INVARIANT_ROWS, KEY_BLOCK

from .test_invariant import QWEN05, _lm, _tiny, worst_difference
from .test_real_models import need_model

if not q4.available():
    pytest.skip(f"vocabbridge._q4 not built ({q4.BUILD_ERROR})", allow_module_level=True)


@pytest.fixture(autouse=True)
def _torch_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _pair(kind: str, min_rows=1):
    """The same q4 model behind the transformers sessions and the lean ones."""
    model = _tiny(kind)
    q4.make_q4(model)
    assert lean.why_not(model) == ""
    plain = _lm(model, rows=INVARIANT_ROWS, min_rows=min_rows)
    fast = _lm(model, rows=INVARIANT_ROWS, min_rows=min_rows)
    fast.lean = lean.lean_decoder(model)
    assert isinstance(fast.session(), lean.LeanSession) and not isinstance(plain.session(), lean.LeanSession)
    return plain, fast


def _prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(3, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_lean_forward_matches_the_transformers_q4_forward(kind):
    """Prefill, plain steps, verifications and the hidden states MTP / EAGLE-3 heads read: the
    transformers forward's values up to RMSNorm's summation order (1e-5 on logits of size ~1)."""
    plain, fast = _pair(kind)
    a, b = plain.session(), fast.session()
    prompt = _prompt(KEY_BLOCK + 9)
    close(a.extend(prompt, keep=4), b.extend(prompt, keep=4))
    for t in (5, 77, 299):
        close(a.extend([t]), b.extend([t]))
    for k in range(1, 9):
        feed = _prompt(k, seed=k)
        close(a.extend(feed, keep=k), b.extend(feed, keep=k))
        a.truncate(len(a) - 1)
        b.truncate(len(b) - 1)
    la, ha = a.extend([9, 8, 7], keep=3, hidden=True)
    lb, hb = b.extend([9, 8, 7], keep=3, hidden=True)
    close(la, lb), close(ha, hb)
    assert hb.shape == (3, 64)
    la, ha = a.extend([6, 5], keep=1, hidden=(0, 1, 2))
    lb, hb = b.extend([6, 5], keep=1, hidden=(0, 1, 2))
    close(la, lb), close(ha, hb)
    assert hb.shape == (2, 3 * 64) and torch.equal(ha[:, :64], hb[:, :64])  # layer 0's input: the embeddings
    assert a.ids == b.ids


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and float((a - b).abs().max()) < 1e-5 * max(1.0, float(a.abs().max()))
    if a.shape[-1] == 300:  # logits: the same greedy choices
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kind, prompt_len", [("qwen2", KEY_BLOCK - 1), ("qwen2", 2 * KEY_BLOCK + 5), ("llama", 3)])
def test_lean_verification_equals_plain_rows_bit_for_bit(kind, prompt_len):
    """Row counts 1…8 beside each other: each row its one-row bits (unpadded plain steps)."""
    _, fast = _pair(kind)
    for k in range(1, 9):
        assert worst_difference(fast, prompt_len, k) == 0.0, k


def test_each_row_count_gives_each_row_its_one_row_bits():
    """One feed of R = 1…8 rows against the same tokens fed one row at a time, after the same cache."""
    _, fast = _pair("qwen2")
    prompt, step = _prompt(50), _prompt(8, seed=2)
    s = fast.session()
    s.extend(prompt)
    alone = torch.cat([s.extend([t]) for t in step])
    for R in range(1, 9):
        s.truncate(len(prompt))
        assert torch.equal(s.extend(step[:R], keep=R), alone[:R]), R


def test_cropping_the_preallocated_cache_then_continuing_equals_a_fresh_run(monkeypatch):
    """A rejected draft cropped away, then other tokens: what a session that never saw the draft
    computes; and a cache that outgrows its room (here 16 positions, doubling) keeps its values."""
    monkeypatch.setattr(lean.PreallocatedKV.__init__, "__defaults__", (16, 1 << 30))
    _, fast = _pair("llama")
    prompt = _prompt(30)
    s = fast.session()
    assert s.cache.room == 16
    s.extend(prompt)
    s.extend([11, 12, 13, 14, 15], keep=5)  # a draft, then rejected after two tokens
    s.truncate(len(prompt) + 2)
    assert s.cache.length == len(prompt) + 2 and s.ids == prompt + [11, 12]
    got = s.extend([40, 41, 42], keep=3)
    more = s.extend(_prompt(40, seed=3), keep=2)
    fresh = fast.session()
    fresh.extend(prompt)
    fresh.extend([11, 12, 13, 14, 15][:2], keep=2)
    assert torch.equal(fresh.extend([40, 41, 42], keep=3), got)
    assert torch.equal(fresh.extend(_prompt(40, seed=3), keep=2), more)
    assert s.cache.room >= len(s.ids) and s.cache.room == 128  # 16 → 32 → 64 → 128
    s.sync(prompt + [11])  # the engine's re-synchronisation: crop to the common prefix, feed the rest
    assert s.ids == prompt + [11] and s.cache.length == len(prompt) + 1


def test_the_room_stops_at_the_model_context():
    kv = lean.PreallocatedKV(2, 2, 8, room=16, most=100)
    kv.reserve(70)
    assert kv.room == 100  # not 128
    kv.reserve(101)  # past the context (the session refuses it first; the cache still holds it)
    assert kv.room == 101


def test_thread_counts_do_not_change_the_lean_forward():
    """Plain steps on one kernel thread, verifications on two (and the reverse): the same bits."""
    _, fast = _pair("qwen2")
    ext = q4.require()
    before = ext.threads()
    prompt, step = _prompt(KEY_BLOCK + 4), _prompt(6, seed=5)
    try:
        for plain_threads, verify_threads in ((1, 2), (2, 1), (3, 1)):
            s = fast.session()
            ext.set_threads(plain_threads)
            s.extend(prompt)
            alone = torch.cat([s.extend([t]) for t in step])
            s.truncate(len(prompt))
            ext.set_threads(verify_threads)
            assert torch.equal(s.extend(step, keep=len(step)), alone), (plain_threads, verify_threads)
    finally:
        ext.set_threads(before)


def test_padded_plain_steps_crop_the_padding():
    """min_rows = INVARIANT_ROWS: every one-row step padded, the padding's KV entries cropped."""
    plain, fast = _pair("qwen2", min_rows=None)
    a, b = plain.session(), fast.session()
    prompt = _prompt(20)
    close(a.extend(prompt), b.extend(prompt))
    for t in (3, 4, 5):
        close(a.extend([t]), b.extend([t]))
    assert b.cache.length == len(prompt) + 3 == len(b.ids)


def test_what_the_lean_forward_does_not_run_keeps_transformers():
    """A model the lean forward does not reproduce gets no LeanDecoder (its sessions stay transformers')."""
    assert "q4 kernel" in lean.why_not(_tiny("llama"))  # never made q4
    model = _tiny("qwen2")
    model.config.hidden_act = "gelu"
    q4.make_q4(model)
    assert "activation" in lean.why_not(model) and lean.lean_decoder(model) is None
    model = _tiny("qwen2")
    model.config.model_type = "mistral"
    q4.make_q4(model)
    assert "model type" in lean.why_not(model)


def test_small_routines_compute_each_row_on_its_own():
    """rms_norm and rope_kv: transformers' formulas (RMSNorm to its rounding, RoPE bit for bit), and
    each row the same bits whether computed alone or among 1…8 rows."""
    ext = q4.require()
    g = torch.Generator().manual_seed(4)
    R, D, H, Hkv, d, room, L0 = 8, 200, 4, 2, 16, 32, 5
    x, add, w = torch.randn(R, D, generator=g) * 3, torch.randn(R, D, generator=g), torch.randn(D, generator=g)
    out, xs = torch.empty(R, D), x.clone()
    ext.rms_norm(xs.data_ptr(), add.data_ptr(), w.data_ptr(), out.data_ptr(), R, D, 1e-6)
    s = x + add
    assert torch.equal(xs, s)
    assert (out - w * (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6))).abs().max() < 1e-5
    for r in range(1, R + 1):
        one, xr = torch.empty(r, D), x[:r].clone()
        ext.rms_norm(xr.data_ptr(), add.data_ptr(), w.data_ptr(), one.data_ptr(), r, D, 1e-6)
        assert torch.equal(one, out[:r]), r
    width = (H + 2 * Hkv) * d
    qkv = torch.randn(R, width, generator=g)
    ang = torch.randn(R, d // 2, generator=g)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    k, v = torch.zeros(Hkv, room, d), torch.zeros(Hkv, room, d)
    done = qkv.clone()
    ext.rope_kv(done.data_ptr(), R, H, Hkv, d, cos.data_ptr(), sin.data_ptr(), k.data_ptr(), v.data_ptr(), room, L0)
    heads = qkv[:, : (H + Hkv) * d].view(R, H + Hkv, d)
    rotated = torch.cat((-heads[..., d // 2 :], heads[..., : d // 2]), -1)
    want = heads * cos[:, None] + rotated * sin[:, None]  # transformers' apply_rotary_pos_emb
    assert torch.equal(done[:, : (H + Hkv) * d].view(R, H + Hkv, d), want)
    assert torch.equal(done[:, (H + Hkv) * d :], qkv[:, (H + Hkv) * d :])  # v as it was
    assert torch.equal(k[:, L0 : L0 + R], want[:, H:].transpose(0, 1))
    assert torch.equal(v[:, L0 : L0 + R], qkv[:, (H + Hkv) * d :].view(R, Hkv, d).transpose(0, 1))
    assert not k[:, :L0].any() and not k[:, L0 + R :].any()  # nothing written outside the rows' positions
    with pytest.raises(ValueError, match="bad rope_kv shape"):
        ext.rope_kv(0, R, H, Hkv, d, 0, 0, 0, 0, room, room - R + 1)  # past the cache's room


@pytest.mark.slow
def test_real_gguf_lean_is_exact_across_rows_and_as_close_to_the_float_model():
    """Qwen2.5-Coder-0.5B's GGUF through load_q4_lm: lean by default; verification logits equal
    row-by-row logits past a key block; and as close to the fp32 model as the transformers q4
    forward is. (The two q4 forwards differ by more than RMSNorm's last bit: a rounding that moves an
    int8 activation by one step moves the layers after it; measured mean |Δ| 0.08, both 0.42-0.43
    from fp32.)"""
    from vocabbridge.engine.model import load_causal_lm

    need_model(QWEN05)
    lm = q4.load_q4_lm(str(QWEN05))
    assert isinstance(lm.lean, lean.LeanDecoder) and isinstance(lm.session(), lean.LeanSession)
    for k in (1, 4, 7):
        assert worst_difference(lm, KEY_BLOCK + 20, k, steps=10, vocab=lm.vocab_size) == 0.0, k
    prompt = torch.randint(3, lm.vocab_size, (KEY_BLOCK + 3,), generator=torch.Generator().manual_seed(1)).tolist()
    fast = lm.session().extend(prompt, keep=100)
    lm.lean = None
    assert not isinstance(lm.session(), lean.LeanSession)
    slow = lm.session().extend(prompt, keep=100)
    ref = load_causal_lm(str(QWEN05), dtype="float32", device="cpu").session().extend(prompt, keep=100)
    err = {name: float((x - ref).abs().mean()) for name, x in (("lean", fast), ("transformers", slow))}
    top1 = {name: float((x.argmax(-1) == ref.argmax(-1)).float().mean()) for name, x in (("lean", fast), ("transformers", slow))}
    assert err["lean"] < 1.15 * err["transformers"], err
    assert top1["lean"] > top1["transformers"] - 0.05, top1
