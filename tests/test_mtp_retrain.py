"""``train-head --init checkpoint``: the target's own MTP head (DeepSeek-V3, EXAONE 4.5 / Qwen3.5
``mtp.*``, MiMo layouts) retrained with the body frozen, and exported back in the target's own
layout (the original weight files linked, only the MTP tensors in one new file), on tiny random
checkpoints in each layout."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from tests.test_mtp_layouts import LAYOUT_OF, write_checkpoint
from vocabbridge.engine import SamplingParams, SpecEngine, load_causal_lm
from vocabbridge.engine.drafters.mtp import MTPDrafter
from vocabbridge.errors import ConfigError
from vocabbridge.heads import head_from_checkpoint
from vocabbridge.heads.draft_head import causal_mask, target_parts
from vocabbridge.heads.layouts import checkpoint_tensors, head_from_weights, read_mtp_weights
from vocabbridge.heads.store import load_head
from vocabbridge.spec import EngineSpec
from vocabbridge.testing import tiny_model
from vocabbridge.training.export import export_for_vllm
from vocabbridge.training.export_own import INDEX, MTP_FILE, weight_map
from vocabbridge.training.train import Recipe, checkpoint_start, train_head

RECIPE = Recipe(
    init="checkpoint",
    max_prompts=16,
    new_tokens=16,
    gen_batch=8,
    epochs=2,
    batch_tokens=384,
    lr=3e-3,
    dtype="float32",
    data_dtype="float32",
)


@pytest.fixture(scope="module", params=list(LAYOUT_OF))
def retrained(request, tok_dirs, base_view, tmp_path_factory):
    """A tiny target with MTP weights in a real layout, and its own head retrained from them."""
    root = tmp_path_factory.mktemp(f"retrain-{request.param}")
    ck = write_checkpoint(request.param, root / "target", tok_dirs["base"], base_view.size)
    messages: list[str] = []
    result = train_head(str(ck["folder"]), root / "head", RECIPE, quiet=True, say=messages.append)
    return ck | {"head": root / "head", "result": result, "messages": messages}


def _outputs(head, parts, dev):
    torch.manual_seed(1)
    n = 6
    h = torch.randn(1, n, parts.hidden_size, device=dev)
    toks = torch.randint(0, parts.embed.weight.shape[0], (1, n), device=dev)
    pos = torch.arange(n, device=dev)[None]
    with torch.inference_mode():
        g = head(h, toks, pos, mask=causal_mask(n, 0, device=dev))
        return g, head.logits(g)


# ==== the start and the training ================================================================


def test_the_start_is_the_checkpoints_own_head(retrained, tmp_path):
    """Before any step the head computes what ``--drafter mtp`` computes with the checkpoint: the
    start itself, and a whole run whose steps move nothing (lr 1e-30, on the same data)."""
    folder = str(retrained["folder"])
    target = load_causal_lm(folder, dtype="float32")
    parts = target_parts(target.model)
    own = MTPDrafter.from_spec(EngineSpec(target=folder, drafter="mtp", drafter_dtype="float32"), target, None).head
    want = _outputs(own, parts, target.device)
    layout, start = checkpoint_start(folder, folder, parts)
    assert layout == retrained["layout"]
    assert start.d2t is None and start.lm_head is None  # the whole vocabulary, the target's lm_head
    got = _outputs(start.to(target.device), parts, target.device)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])

    still = replace(RECIPE, lr=1e-30, epochs=1)
    train_head(folder, tmp_path / "still", still, quiet=True, say=lambda m: None, data_dir=retrained["head"] / "train" / "data")
    spec = EngineSpec(target=folder, drafter=f"mtp:{tmp_path / 'still'}", drafter_dtype="float32")
    got = _outputs(MTPDrafter.from_spec(spec, target, None).head, parts, target.device)
    assert torch.allclose(got[0], want[0], rtol=0, atol=1e-6) and torch.allclose(got[1], want[1], rtol=0, atol=1e-5)


def test_training_moves_only_the_heads_weights_and_lowers_the_loss(retrained):
    r, head_dir = retrained["result"], retrained["head"]
    cfg = json.loads((head_dir / "config.json").read_text())
    assert cfg["training"]["recipe"]["init"] == "checkpoint" and cfg["training"]["recipe"]["draft_vocab"] == 0
    assert cfg["training"]["checkpoint_mtp"]["layout"] == retrained["layout"]
    assert cfg["training"]["least_squares_r2"] == {}  # no least-squares start
    assert head_from_checkpoint(head_dir)
    trained = load_file(str(head_dir / "head.safetensors"))
    assert "d2t" not in trained and not any(k.startswith(("lm_head", "embed")) for k in trained)
    start = retrained["state"]  # the checkpoint's own head
    assert set(trained) == set(start)
    moved = [k for k in start if not torch.equal(trained[k], start[k].float())]
    assert any(k.startswith("layer.") for k in moved) and "eh_proj.weight" in moved
    losses = [h["loss"] for h in r.history if "loss" in h]
    assert len(losses) >= 6 and sum(losses[-3:]) < sum(losses[:3])
    assert r.eval["acceptance_per_position"]  # evaluated on held-out prompts


def test_greedy_output_with_the_retrained_head_equals_plain(retrained):
    folder = str(retrained["folder"])
    target = load_causal_lm(folder, dtype="float32")
    spec = EngineSpec(target=folder, drafter=f"mtp:{retrained['head']}", drafter_dtype="float32")
    d = MTPDrafter.from_spec(spec, target, None)
    ids = target.view.encode("Hello world! It's a beautiful day")
    params = SamplingParams(max_new_tokens=32, ignore_eos=True)
    want = SpecEngine(target).generate(ids, params)
    got = SpecEngine(target, d, num_speculative_tokens=3).generate(ids, params)
    assert got.tokens == want.tokens and got.stats.draft_tokens > 0


# ==== the export in the target's own layout ========================================================


def test_the_export_is_the_checkpoint_with_only_the_mtp_tensors_replaced(retrained):
    head_dir, folder = retrained["head"], retrained["folder"]
    spec = export_for_vllm(head_dir, num_speculative_tokens=2)
    out = head_dir / "vllm"
    assert spec == {"method": "mtp", "model": str(out), "num_speculative_tokens": 2}
    assert json.loads((out / "config.json").read_text()) == json.loads((folder / "config.json").read_text())
    assert (out / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()

    # nothing copied: every weight file but the new one is a symlink to the original
    weights = sorted(f for f in out.iterdir() if f.name.endswith(".safetensors"))
    linked = [f for f in weights if f.name != MTP_FILE]
    assert linked and all(f.is_symlink() and f.resolve() == (folder / f.name).resolve() for f in linked)
    assert not (out / MTP_FILE).is_symlink()

    # the index resolves every tensor: the MTP tensors to the new file, everything else to the originals
    original = weight_map(folder)
    wmap = json.loads((out / INDEX).read_text())["weight_map"]
    assert set(wmap) == set(original)
    new = load_file(str(out / MTP_FILE))
    assert {n for n, f in wmap.items() if f == MTP_FILE} == set(new)
    for name, f in wmap.items():
        with safe_open(str(out / f), "pt") as a, safe_open(str(original[name]), "pt") as b:
            mine, theirs = a.get_tensor(name), b.get_tensor(name)
        assert mine.dtype == theirs.dtype and mine.shape == theirs.shape, name
        if f != MTP_FILE:
            assert torch.equal(mine, theirs), name  # bit for bit the original

    # the MTP tensors are the trained head's, read back through the layout's own reader
    target = load_causal_lm(str(folder), dtype="float32", pack=False)
    parts = target_parts(target.model)
    layout, read = read_mtp_weights([out / f for f in sorted(set(wmap.values()))], num_layers=parts.num_layers)
    assert layout == retrained["layout"]
    back = head_from_weights(parts, layout, read, source="export").state_dict()
    trained = load_head(head_dir, parts, tokenizer_fingerprint=target.view.fingerprint, source=str(folder)).state_dict()
    assert set(back) == set(trained)
    for k in trained:
        assert torch.equal(back[k].cpu(), trained[k].cpu()), k  # the fixture's checkpoint is float32: exact
    assert json.loads((out / "vocabbridge-export.json").read_text())["checkpoint_layout"] == layout


def test_exporting_again_replaces_the_export_and_leaves_the_originals(retrained):
    head_dir, folder = retrained["head"], retrained["folder"]
    before = {f.name: f.stat().st_mtime_ns for f in folder.iterdir()}
    export_for_vllm(head_dir)
    export_for_vllm(head_dir)
    assert {f.name: f.stat().st_mtime_ns for f in folder.iterdir()} == before
    assert not (head_dir / ".vllm.tmp").exists()
    assert all(os.path.isabs(os.readlink(f)) for f in (head_dir / "vllm").iterdir() if f.is_symlink())


# ==== what is refused ===============================================================================


def test_checkpoint_init_is_for_mtp_heads_over_the_whole_vocabulary():
    assert Recipe(init="checkpoint").draft_vocab == 0
    with pytest.raises(ConfigError, match="--init checkpoint .* --arch mtp"):
        Recipe(init="checkpoint", arch="eagle3")
    with pytest.raises(ConfigError, match="whole vocabulary.*leave --draft-vocab out"):
        Recipe(init="checkpoint", draft_vocab=5000)


def test_a_target_without_mtp_weights_is_refused_before_any_data(tok_dirs, tmp_path):
    target = tiny_model(tmp_path / "plain", tok_dirs["base"], seed=0, layers=2)
    with pytest.raises(ConfigError, match=r"has none in a layout vocabbridge reads .*DeepSeek-V3.*MiMo.*--init identity"):
        train_head(str(target), tmp_path / "head", RECIPE, quiet=True, say=lambda m: None)
    assert not (tmp_path / "head" / "train" / "data").exists()


def test_the_inverse_names_split_fused_experts_back():
    gate_up = torch.arange(2 * 4 * 3.0).view(2, 4, 3)  # [E, 2I, d]
    down = torch.arange(2 * 3 * 2.0).view(2, 3, 2)  # [E, d, I]
    state = {"layer.mlp.experts.gate_up_proj": gate_up, "layer.mlp.experts.down_proj": down}
    names = [f"model.layers.2.mlp.experts.1.{p}_proj.weight" for p in ("gate", "up", "down")]
    out = checkpoint_tensors(names, state, "deepseek", num_layers=2)
    assert torch.equal(out[names[0]], gate_up[1, :2]) and torch.equal(out[names[1]], gate_up[1, 2:])
    assert torch.equal(out[names[2]], down[1])
    assert checkpoint_tensors(["model.layers.2.embed_tokens.weight"], state, "deepseek", num_layers=2) == {}


def test_resume_checks_the_init(retrained, tmp_path):
    if retrained["layout"] != "mimo":
        pytest.skip("one layout is enough")
    messages: list[str] = []
    train_head(str(retrained["folder"]), retrained["head"], RECIPE, quiet=True, say=messages.append)
    assert any("resumed at step" in m for m in messages)
    other = replace(RECIPE, init="identity")
    with pytest.raises(ConfigError, match="another recipe"):
        train_head(str(retrained["folder"]), retrained["head"], other, quiet=True, say=lambda m: None)


# ==== vLLM's command line ===========================================================================


def test_vllm_serves_the_target_with_the_export_as_its_native_mtp_head(tmp_path):
    """The target is served as always; the export is the folder vLLM's native mtp reads its head
    from (its config is the target's own: vLLM makes its MTP model of it), no --hf-overrides."""
    from vocabbridge.vllm.backend import vllm_command

    target, head = tmp_path / "target", tmp_path / "head"
    target.mkdir()
    head.mkdir()
    (head / "config.json").write_text(
        json.dumps({"format": "vocabbridge.mtp-head/1", "arch": "mtp", "training": {"recipe": {"init": "checkpoint"}}})
    )
    cmd = vllm_command(EngineSpec(target=str(target), drafter=f"mtp:{head}", num_speculative_tokens=2), cpu=True)
    argv = cmd.argv
    assert argv[:3] == ["vllm", "serve", str(target)] and "--hf-overrides" not in argv
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "mtp",
        "model": str(head / "vllm"),
        "num_speculative_tokens": 2,
    }
    assert cmd.export_head == str(head)
    assert any("the target's own MTP layout" in n for n in cmd.notes)

    (head / "config.json").write_text(json.dumps({"format": "vocabbridge.mtp-head/1", "arch": "mtp"}))
    mimo = vllm_command(EngineSpec(target=str(target), drafter=f"mtp:{head}", num_speculative_tokens=2), cpu=True)
    assert "--hf-overrides" in mimo.argv  # a head in MiMo's layout beside a Qwen2 or Llama target still needs it


def test_serve_exports_when_the_head_is_newer_than_its_export(retrained):
    from vocabbridge.vllm.backend import export_stale_head

    if retrained["layout"] != "mimo":
        pytest.skip("one layout is enough")
    head = retrained["head"]
    export_for_vllm(head)
    said: list[str] = []
    export_stale_head(str(head), say=said.append)
    assert said == []  # the export is newer than the head
    later = (head / "vllm" / "vocabbridge-export.json").stat().st_mtime + 5  # file times are coarse: no tie
    os.utime(head / "head.safetensors", (later, later))
    export_stale_head(str(head), say=said.append)
    assert len(said) == 1 and "the target's own MTP layout" in said[0]
    assert (head / "vllm" / MTP_FILE).is_file()
