"""Batch invariance by construction (engine/invariant.py): a verification forward over k+1 tokens
gives, for each position, the logits that plain one-token decoding gives there, bit for bit.

The unit half runs on tiny random checkpoints in both layouts the fused linears cover (Qwen2, with
q/k/v biases, and Llama); the naive path (fbgemm's dynamic int8 as it is, no padding) is shown to
fail the same check. The real half runs the whole engine on SmolLM2-135M (the GGUF CI fetches):
every drafter, heterogeneous ones included, gives exactly the plain answer.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from vocabbridge.engine import SamplingParams, SpecEngine
from vocabbridge.engine.factory import build_engine
from vocabbridge.engine.invariant import INVARIANT_ROWS, KEY_BLOCK, FusedPart, RowInt8Linear, make_invariant, probe_lone_rows
from vocabbridge.engine.model import CausalLM
from vocabbridge.engine.quant import quantize_int8
from vocabbridge.spec import EngineSpec

from .test_real_models import MODELS, PROMPTS, SMOL, need_model, smol  # noqa: F401  (the fixture)

QWEN05 = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"


def _tiny(kind: str) -> torch.nn.Module:
    torch.manual_seed(0)
    common = dict(
        vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
    )
    model = Qwen2ForCausalLM(Qwen2Config(**common)) if kind == "qwen2" else LlamaForCausalLM(LlamaConfig(**common))
    for p in model.parameters():  # larger weights than the init: a rounding difference must show in the logits
        p.data.normal_(0, 0.2)
    return model.eval()


def _lm(model, rows, min_rows=None) -> CausalLM:
    return CausalLM(
        model,
        view=None,
        source="tiny",
        device="cpu",
        dtype=torch.float32,
        vocab_size=300,
        max_context=4096,
        rows=rows,
        min_rows=min_rows,
    )


def worst_difference(lm, prompt_len: int, k: int, steps: int = 12, vocab: int = 300) -> float:
    """Largest |verification logit − plain logit| over ``steps`` positions after a random prompt, the
    verification run k+1 tokens at a time over the tokens plain greedy decoding produced (any
    session backend: torch or llama.cpp)."""
    g = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(3, vocab, (prompt_len,), generator=g).tolist()
    s = lm.session()
    tok = int(s.extend(prompt)[-1].argmax())
    toks, plain = [], []
    for _ in range(steps):
        toks.append(tok)
        row = s.extend([tok])[0]
        plain.append(row)
        tok = int(row.argmax())
    plain = torch.stack(plain)
    s.truncate(prompt_len)
    worst = 0.0
    for i in range(0, steps - k, k + 1):
        got = s.extend(toks[i : i + k + 1], keep=k + 1)
        worst = max(worst, float((got - plain[i : i + k + 1]).abs().max()))
    return worst


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_naive_int8_verification_differs_from_plain_rows(kind):
    """The failure this module exists for: fbgemm's dynamic int8 quantizes a batch with one scale."""
    lm = _lm(quantize_int8(_tiny(kind)), rows=None)
    assert max(worst_difference(lm, 40, k) for k in (2, 4)) > 1e-4


@pytest.mark.parametrize("min_rows", [None, 1], ids=["padded", "one-row-steps"])
@pytest.mark.parametrize("kind", ["qwen2", "llama"])
@pytest.mark.parametrize("prompt_len", [3, KEY_BLOCK - 3, KEY_BLOCK - 1, 2 * KEY_BLOCK + 5])
def test_invariant_verification_equals_plain_rows_bit_for_bit(kind, prompt_len, min_rows):
    """k = 1…8 (k + 1 > INVARIANT_ROWS verifies in pieces), prompts and KV lengths across key blocks,
    with every forward padded to INVARIANT_ROWS and with plain steps of one row (what the load probe
    allows where it finds them invariant)."""
    model = _tiny(kind)
    make_invariant(model)
    assert isinstance(model.model.layers[0].self_attn.k_proj, FusedPart)
    assert isinstance(model.lm_head, RowInt8Linear)
    lm = _lm(model, rows=INVARIANT_ROWS, min_rows=min_rows)
    for k in range(1, 9):
        assert worst_difference(lm, prompt_len, k) == 0.0, k


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_the_load_probe_tells_an_invariant_target_from_a_naive_one(kind):
    """probe_lone_rows (what decides at load whether plain steps run one row) says yes for the
    invariant int8 target and no for fbgemm's dynamic int8 as it is, and agrees with a direct check."""
    model = _tiny(kind)
    make_invariant(model)
    ours = _lm(model, rows=INVARIANT_ROWS, min_rows=1)
    naive = _lm(quantize_int8(_tiny(kind)), rows=INVARIANT_ROWS, min_rows=1)
    assert probe_lone_rows(ours, most=INVARIANT_ROWS) and worst_difference(ours, 140, 4) == 0.0
    assert not probe_lone_rows(naive, most=INVARIANT_ROWS) and worst_difference(naive, 140, 4) > 0.0
    ours.max_context = 200  # too short a context for the probe: the padded path, no error
    assert not probe_lone_rows(ours, most=INVARIANT_ROWS)


def test_row_int8_linear_rows_do_not_see_each_other():
    torch.manual_seed(1)
    lin = RowInt8Linear(torch.nn.Linear(256, 96))
    x = torch.randn(7, 256) * torch.logspace(-3, 3, 7)[:, None]  # rows of very different scales
    alone = torch.cat([lin(x[i : i + 1]) for i in range(7)])
    assert torch.equal(lin(x), alone)
    assert torch.equal(lin(torch.zeros(2, 256)), lin.bias.expand(2, -1))  # an all-zero row is not a division by zero
    rel = (lin(x) - torch.nn.functional.linear(x, *_weights(lin))).norm() / torch.nn.functional.linear(x, *_weights(lin)).norm()
    assert rel < 0.02  # int8 weights and activations: close to the float layer


def _weights(lin: RowInt8Linear):
    w = lin.inner.weight().dequantize()
    return w, lin.bias


# ==== the real model: every drafter gives the plain answer ====================================


@pytest.mark.parametrize(
    "drafter, mode",
    [("ngram", "auto"), ("self", "draft"), ("self", "bridged"), ("qwen", "text")],
)
def test_every_drafter_is_token_identical_on_the_int8_target(smol, drafter, mode):  # noqa: F811
    if drafter == "qwen":
        need_model(QWEN05)
    name = {"self": str(SMOL), "qwen": str(QWEN05)}.get(drafter, drafter)
    spec = EngineSpec(target=str(SMOL), drafter=name, mode=mode, dtype="int8", num_speculative_tokens=4)
    built = build_engine(spec, loaded=smol)
    assert built.target.rows == INVARIANT_ROWS and built.target.min_rows in (1, INVARIANT_ROWS)
    plain = SpecEngine(built.target)
    params = SamplingParams(max_new_tokens=32)
    for p in PROMPTS:
        ids = built.target.view.encode(p)
        want = plain.generate(ids, params).tokens
        got = built.engine.generate(ids, params)
        assert got.tokens == want, (drafter, mode, p)
