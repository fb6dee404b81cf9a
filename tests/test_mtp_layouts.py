"""Real checkpoints' MTP weights (DeepSeek-V3, EXAONE 4.5 / Qwen3.5 ``mtp.*``, MiMo) read into the
engine's mtp drafter, on tiny random checkpoints written in those layouts; and the vLLM export."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Exaone4Config,
    Exaone4ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
)

from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.errors import ConfigError
from vocabbridge.heads.draft_head import MTPHead, causal_mask, target_parts
from vocabbridge.heads.layouts import head_from_weights, layer_index_for, layout_of, read_mtp_weights
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.training.export import export_for_vllm, mimo_state
from vocabbridge.training.train import Recipe, train_head

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=512)
LAYOUT_OF = {"deepseek": "deepseek", "mtp-exaone": "mtp", "mtp-qwen3.5": "mtp", "mimo": "mimo"}


def _configs(vocab: int, **size) -> dict:
    """(model class, config) per checkpoint kind; ``size`` overrides any config field."""

    def kw(**fields) -> dict:
        return {"vocab_size": vocab, **SMALL, "tie_word_embeddings": False, **fields} | size

    return {
        "deepseek": (
            DeepseekV3ForCausalLM,
            DeepseekV3Config(
                **kw(
                    num_key_value_heads=4,
                    moe_intermediate_size=32,
                    n_routed_experts=4,
                    n_shared_experts=1,
                    num_experts_per_tok=2,
                    n_group=1,
                    topk_group=1,
                    first_k_dense_replace=1,
                    q_lora_rank=None,
                    kv_lora_rank=16,
                    qk_nope_head_dim=8,
                    qk_rope_head_dim=8,
                    v_head_dim=8,
                    num_nextn_predict_layers=1,
                )
            ),
        ),
        "mtp-exaone": (
            Exaone4ForCausalLM,
            Exaone4Config(**kw(num_key_value_heads=2, layer_types=["sliding_attention", "full_attention"], sliding_window=64)),
        ),
        "mtp-qwen3.5": (
            Qwen3_5ForCausalLM,
            Qwen3_5TextConfig(
                **kw(
                    num_key_value_heads=2, head_dim=16, layer_types=["full_attention", "full_attention"], mtp_num_hidden_layers=1
                )
            ),
        ),
        "mimo": (  # MiMo: a Qwen2 model whose checkpoint carries model.mtp_layers.0.* (vLLM's MiMoForCausalLM)
            Qwen2ForCausalLM,
            Qwen2Config(**kw(num_key_value_heads=2)),
        ),
    }


def _unfused(key: str, t: torch.Tensor) -> dict[str, torch.Tensor]:
    """transformers' fused expert tensors as the per-expert tensors checkpoints store."""
    if key.endswith("experts.gate_up_proj"):
        base, half = key[: -len("gate_up_proj")], t.shape[1] // 2
        return {
            f"{base}{e}.{n}_proj.weight": w for e in range(t.shape[0]) for n, w in (("gate", t[e, :half]), ("up", t[e, half:]))
        }
    if key.endswith("experts.down_proj"):
        base = key[: -len("down_proj")]
        return {f"{base}{e}.down_proj.weight": t[e] for e in range(t.shape[0])}
    return {key: t}


def checkpoint_names(state: dict[str, torch.Tensor], layout: str, num_layers: int) -> dict[str, torch.Tensor]:
    """A head's tensors under a real checkpoint's names (what vLLM's loaders read)."""
    if layout == "mimo":
        return mimo_state(state, hidden_size=state["eh_proj.weight"].shape[0])
    if layout == "deepseek":
        prefix, own = (
            f"model.layers.{num_layers}.",
            {"enorm": "enorm", "hnorm": "hnorm", "eh_proj": "eh_proj", "norm": "shared_head.norm"},
        )
    else:
        prefix = "mtp."
        own = {"enorm": "pre_fc_norm_embedding", "hnorm": "pre_fc_norm_hidden", "eh_proj": "fc", "norm": "norm"}
    out = {}
    for key, t in state.items():
        module, _, rest = key.partition(".")
        if module in own:
            out[f"{prefix}{own[module]}.{rest}"] = t
        else:
            name = f"{prefix}{rest}" if layout == "deepseek" else f"{prefix}layers.0.{rest}"
            out.update(_unfused(name, t))
    return out


def write_checkpoint(name: str, folder, tok_dir, vocab: int, **size) -> dict:
    """A tiny target folder with random MTP weights in a real layout (``name``: a key of _configs),
    its tokenizer beside it; the head those weights make."""
    layout = LAYOUT_OF[name]
    cls, cfg = _configs(vocab, **size)[name]
    torch.manual_seed(0)
    model = cls(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # sharp logits: greedy paths are not all ties
    parts = target_parts(model)
    head = MTPHead(parts, layer_index=layer_index_for(layout, parts), draft_ids=None)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.05 + (1.0 if p.ndim == 1 and "norm" in str(p.shape) else 0.0))
    model.save_pretrained(str(folder))
    for f in tok_dir.iterdir():
        shutil.copy(f, folder / f.name)
    if layout == "mimo":  # save_pretrained names the class it saved; MiMo's config names its own
        config = json.loads((folder / "config.json").read_text())
        config.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
        (folder / "config.json").write_text(json.dumps(config, indent=2))
    names = checkpoint_names(head.state_dict(), layout, parts.num_layers)
    extra = {"model.embed_tokens.weight": model.get_input_embeddings().weight.detach().clone()}  # shared copies are skipped
    if layout == "deepseek":
        extra = {
            f"model.layers.{parts.num_layers}.{k}": v for k, v in [("embed_tokens.weight", extra["model.embed_tokens.weight"])]
        }
        extra[f"model.layers.{parts.num_layers}.shared_head.head.weight"] = model.lm_head.weight.detach().clone()
    save_file({k: v.contiguous() for k, v in (names | extra).items()}, str(folder / "mtp.safetensors"))
    return {"name": name, "layout": layout, "folder": folder, "state": head.state_dict(), "num_layers": parts.num_layers}


@pytest.fixture(scope="module", params=["deepseek", "mtp-exaone", "mtp-qwen3.5", "mimo"])
def checkpoint(request, tok_dirs, base_view, tmp_path_factory):
    """A tiny target folder with MTP weights in a real layout, and the head those weights make."""
    return write_checkpoint(request.param, tmp_path_factory.mktemp(request.param), tok_dirs["base"], base_view.size)


def test_the_layout_is_recognised_and_only_mtp_tensors_are_read(checkpoint):
    files = sorted(checkpoint["folder"].glob("*.safetensors"))
    layout, weights = read_mtp_weights(files, num_layers=checkpoint["num_layers"])
    assert layout == checkpoint["layout"]
    assert not any(k.startswith(("embed", "lm_head")) for k in weights)
    with safe_open(str(files[0]), "pt") as f:
        assert layout_of(f.keys(), num_layers=checkpoint["num_layers"]) is None  # the main checkpoint alone has none


def test_drafter_mtp_loads_the_checkpoints_own_head(checkpoint):
    target = load_causal_lm(str(checkpoint["folder"]), dtype="float32")
    spec = EngineSpec(target=str(checkpoint["folder"]), drafter="mtp", drafter_dtype="float32")
    d = MTPDrafter.from_spec(spec, target, None)
    got = d.head.state_dict()
    assert set(got) == set(checkpoint["state"])
    for k, v in checkpoint["state"].items():
        assert torch.allclose(got[k].float().cpu(), v.float()), k
    assert d.head.lm_head is None  # the target's own lm_head, shared (as vLLM shares it)
    ids = target.view.encode("Hello world! It's a beautiful day")
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    want = SpecEngine(target).generate(ids, params)
    r = SpecEngine(target, d, num_speculative_tokens=3).generate(ids, params)
    assert r.tokens == want.tokens and r.stats.draft_tokens > 0


def test_a_target_without_mtp_weights_names_train_head(tiny):
    spec = EngineSpec(target=tiny["target"].source, drafter="mtp")
    with pytest.raises(ConfigError, match="no MTP weights .*vocabbridge train-head --target .* --drafter mtp:heads/NAME"):
        MTPDrafter.from_spec(spec, tiny["target"], None)


# ==== the vLLM export (MiMo's layout) ================================================================


@pytest.fixture(scope="module")
def head_dir(tok_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    target = tiny_model(root / "target", tok_dirs["base"], seed=0, layers=2)
    recipe = Recipe(max_prompts=8, new_tokens=8, gen_batch=8, epochs=1, batch_tokens=256, draft_vocab=300, dtype="float32")
    train_head(str(target), root / "head", recipe, quiet=True)
    return root / "head"


def test_export_writes_a_mimo_mtp_checkpoint_vllm_loads(head_dir):
    spec = export_for_vllm(head_dir, num_speculative_tokens=3)
    out = head_dir / "vllm"
    assert spec == {"method": "mtp", "model": str(out), "num_speculative_tokens": 3}
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["model_type"] == "qwen2" and cfg["num_nextn_predict_layers"] == 1
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert f.get_tensor("model.mtp_layers.0.self_attn.q_proj.bias").abs().sum() == 0  # a Llama layer in Qwen2's shape
    prefix = "model.mtp_layers.0."
    for k in ["token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm", "self_attn.o_proj", "mlp.down_proj"]:
        assert f"{prefix}{k}.weight" in keys, k
    assert {"model.embed_tokens.weight", "lm_head.weight"} <= keys  # vLLM's loader wants every parameter
    assert json.loads((out / "vocabbridge-export.json").read_text())["layout"] == "mimo"


def test_the_export_reads_back_as_the_same_head(head_dir, tok_dirs):
    export_for_vllm(head_dir)
    cfg = json.loads((head_dir / "config.json").read_text())
    target = load_causal_lm(cfg["target"]["source"], dtype="float32")
    parts = target_parts(target.model)
    spec = EngineSpec(target=target.source, drafter=f"mtp:{head_dir}", drafter_dtype="float32")
    ours = MTPDrafter.from_spec(spec, target, None).head
    layout, weights = read_mtp_weights([head_dir / "vllm" / "model.safetensors"], num_layers=parts.num_layers)
    assert layout == "mimo"
    dev = target.device
    back = head_from_weights(parts, layout, weights, source="export").to(dev)
    torch.manual_seed(1)
    h, toks, pos = torch.randn(1, 6, parts.hidden_size), torch.randint(0, 800, (1, 6)), torch.arange(6)[None]
    h, toks, pos = h.to(dev), toks.to(dev), pos.to(dev)
    with torch.inference_mode():
        a = ours(h, toks, pos, mask=causal_mask(6, 0, device=dev))
        b = back(h, toks, pos, mask=causal_mask(6, 0, device=dev))
    assert torch.allclose(a, b, atol=5e-2)  # bf16 weights in the export


def test_mimo_names_swap_the_projection_halves():
    w = torch.arange(8.0).view(1, 8)  # [embedding half | hidden half], d = 4
    state = mimo_state({"eh_proj.weight": w, "layer.self_attn.q_proj.weight": torch.ones(2, 4)}, hidden_size=4)
    assert state["model.mtp_layers.0.input_proj.weight"].tolist() == [[4.0, 5.0, 6.0, 7.0, 0.0, 1.0, 2.0, 3.0]]
    assert state["model.mtp_layers.0.self_attn.q_proj.bias"].tolist() == [0.0, 0.0]
