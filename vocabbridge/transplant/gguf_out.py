"""A transplanted drafter as a GGUF file, written with the ``gguf`` package's writer, so llama.cpp
takes it as a draft model for the target and ``--kernels llama.cpp`` loads it.

llama.cpp accepts a draft model only with the target's vocabulary type, the same BOS/EOS (and
whether they are added), vocabulary sizes within 128 and identical token text from id 5 on
(``common_speculative_are_compatible``). So the tokenizer is the target's own: copied key by key
from the target's GGUF when the target is one, else written from its tokenizer (byte-level BPE:
tokens and merges in their ``Ġ`` alias form, llama.cpp's pre-tokenizer name chosen by the split
regex). The weights are the transformers model's, renamed by ``gguf``'s tensor map (Llama's q/k
rows permuted as llama.cpp's rotary expects), 2-d matrices in ``q8_0`` (or ``f16``/``f32``),
norms in f32.

>>> write_gguf(Path("drafters/smollm2-qwen"), target="qwen2.5-coder-1.5b")  # doctest: +SKIP
PosixPath('drafters/smollm2-qwen/smollm2-qwen.gguf')
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import ConfigError, ModelLoadError
from ..presets import resolve_model
from ..tokenizer import TokenizerView, load_tokenizer
from ..tokenizer.encoding import BYTE_LEVEL, byte_level_encode

GGUF_TYPES = ("q8_0", "f16", "f32")
ARCHS = {"llama": "LLAMA", "qwen2": "QWEN2"}  # transformers model_type → gguf.MODEL_ARCH member
PERMUTE_QK = {"llama"}  # llama.cpp's LLAMA arch rotates interleaved pairs; HF checkpoints store halves
# llama.cpp's pre-tokenizer names, by the split regex of a byte-level tokenizer (tokenizer.json's).
PRE_BY_REGEX = {
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+": "gpt-2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "qwen2",
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+": "llama-bpe",
}
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED, TOKEN_UNUSED = 1, 3, 4, 5


def gguf_target(source: str) -> Path | None:
    """The target's GGUF file, when the target is one."""
    path = Path(resolve_model(source)).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    return None


def write_gguf(folder: Path, *, target: str, dest: Path | None = None, qtype: str = "q8_0") -> Path:
    """Write ``folder`` (a transplanted drafter: config.json, model.safetensors, the target's
    tokenizer) as ``dest`` (default ``folder/<folder name>.gguf``)."""
    import gguf
    from safetensors.torch import load_file

    if qtype not in GGUF_TYPES:
        raise ConfigError(f"--gguf-type {qtype}: use one of {', '.join(GGUF_TYPES)}.")
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    model_type = cfg.get("model_type")
    if model_type not in ARCHS:
        raise ConfigError(
            f"--gguf: writing a {model_type} drafter as GGUF is not supported (only {', '.join(ARCHS)}); "
            "transplant without --gguf and convert the folder with llama.cpp's convert_hf_to_gguf.py."
        )
    arch = getattr(gguf.MODEL_ARCH, ARCHS[model_type])
    arch_name = gguf.MODEL_ARCH_NAMES[arch]
    dest = Path(dest) if dest is not None else folder / f"{folder.name}.gguf"
    state = load_file(str(folder / "model.safetensors"))
    tmp = dest.with_name(dest.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch_name)
    _model_metadata(w, cfg, folder.name, qtype)
    target_gguf = gguf_target(target)
    if target_gguf is not None:
        _copy_tokenizer(w, target_gguf)
    else:
        _tokenizer_from_view(w, load_tokenizer(str(folder)), rows=cfg["vocab_size"])
    names = gguf.get_tensor_name_map(arch, cfg["num_hidden_layers"])
    tied = "lm_head.weight" not in state
    for key, tensor in state.items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ConfigError(f"--gguf: no GGUF name for the tensor {key} of a {model_type} model.")
        data = tensor.float().numpy()
        if model_type in PERMUTE_QK and key.endswith(("q_proj.weight", "k_proj.weight")):
            heads = (
                cfg["num_attention_heads"]
                if key.endswith("q_proj.weight")
                else cfg.get("num_key_value_heads", cfg["num_attention_heads"])
            )
            data = _permute(data, heads)
        _add(w, name, data, qtype)
    if tied and model_type == "qwen2" and not cfg.get("tie_word_embeddings", False):
        raise ModelLoadError(f"{folder}: no lm_head.weight although the config says the embeddings are untied.")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dest)
    return dest


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's rotary halves → llama.cpp's interleaved pairs, per head (rows of q_proj or k_proj)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _add(w, name: str, data: np.ndarray, qtype: str) -> None:
    import gguf

    if data.ndim < 2 or qtype == "f32" or data.shape[-1] % 32:
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    elif qtype == "f16":
        w.add_tensor(name, np.ascontiguousarray(data, dtype=np.float16))
    else:
        q = gguf.quants.quantize(np.ascontiguousarray(data, dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
        w.add_tensor(name, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)


def _rope_theta(cfg: dict) -> float:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", None):
        raise ConfigError(
            f"--gguf: rope scaling {rope.get('rope_type') or rope.get('type')} is not written by vocabbridge's GGUF writer."
        )
    return float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))


def _model_metadata(w, cfg: dict, name: str, qtype: str) -> None:
    import gguf

    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w.add_name(name)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(cfg.get("num_key_value_heads", heads))
    w.add_rope_freq_base(_rope_theta(cfg))
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_dimension_count(head_dim)
    if head_dim != cfg["hidden_size"] // heads:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(
        {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[qtype]
    )
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)


# ==== the tokenizer =================================================================================


def _copy_tokenizer(w, target: Path) -> None:
    """Every ``tokenizer.*`` key of the target's GGUF, as it is."""
    import gguf

    reader = gguf.GGUFReader(str(target))
    for field in reader.fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), vtype, sub_type=sub)


def pre_tokenizer_name(view: TokenizerView) -> str:
    """llama.cpp's ``tokenizer.ggml.pre`` for a byte-level tokenizer, by its split regex."""
    regexes = view.pre_tokenizer_regexes
    if len(regexes) == 1 and regexes[0] in PRE_BY_REGEX:
        return PRE_BY_REGEX[regexes[0]]
    raise ConfigError(
        f"--gguf: the target's pre-tokenizer ({'; '.join(regexes) or 'none'}) has no llama.cpp name vocabbridge knows "
        "(gpt-2, qwen2, llama-bpe); pass the target as its .gguf file so its tokenizer is copied as it is."
    )


def _tokenizer_from_view(w, view: TokenizerView, *, rows: int) -> None:
    if view.encoding != BYTE_LEVEL:
        raise ConfigError(
            f"--gguf: {view.source} is a {view.encoding} tokenizer; vocabbridge writes byte-level BPE vocabularies only. "
            "Pass the target as its .gguf file so its tokenizer is copied as it is."
        )
    doc = json.loads(view.doc_json)
    alias = {i: s for s, i in doc["model"]["vocab"].items()}
    added = {a.id: a for a in view.added}
    tokens, types = [], []
    for i in range(max(rows, view.size)):  # llama.cpp sizes the embedding by the token list: padding rows get [PADn]
        b = view.tokens[i] if i < view.size else None
        if i in added:
            tokens.append(added[i].content)
            types.append(TOKEN_CONTROL if added[i].special else TOKEN_USER_DEFINED)
        elif b is None:
            tokens.append(f"[PAD{i}]")
            types.append(TOKEN_UNUSED)
        else:
            tokens.append(alias.get(i) or byte_level_encode(b))
            types.append(TOKEN_NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre_tokenizer_name(view))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([f"{byte_level_encode(a)} {byte_level_encode(b)}" for a, b in view.merges])
    for role, add in (
        ("bos", w.add_bos_token_id),
        ("eos", w.add_eos_token_id),
        ("pad", w.add_pad_token_id),
        ("unk", w.add_unk_token_id),
    ):
        if role in view.roles:
            add(view.roles[role])
    if "end_of_turn" in view.roles:
        w.add_eot_token_id(view.roles["end_of_turn"])
    w.add_add_bos_token(False)
    if view.chat_template:
        w.add_chat_template(view.chat_template)


# ==== llama.cpp's own check =========================================================================

SPEC_VOCAB_MAX_SIZE_DIFFERENCE, SPEC_VOCAB_CHECK_START_TOKEN_ID = 128, 5  # llama.cpp common/speculative.cpp


def llama_draft_compatible(target: str | Path, draft: str | Path) -> tuple[bool, str]:
    """llama.cpp's draft-model check (vocabulary type, BOS/EOS, sizes within 128, token text from id
    5 on), run through llama-cpp-python on both files' vocabularies only. (ok, why not)."""
    from ..engine.llama_cpp import _llama

    L = _llama()
    models = []
    try:
        for p in (target, draft):
            mp = L.llama_model_default_params()
            mp.vocab_only = True
            m = L.llama_model_load_from_file(str(p).encode(), mp)
            if not m:
                return False, f"llama.cpp could not load {p}"
            models.append(m)
        vt, vd = (L.llama_model_get_vocab(m) for m in models)
        if L.llama_vocab_type(vt) != L.llama_vocab_type(vd):
            return False, f"vocabulary types differ ({L.llama_vocab_type(vt)} vs {L.llama_vocab_type(vd)})"
        for what, add, tok in (
            ("bos", L.llama_vocab_get_add_bos, L.llama_vocab_bos),
            ("eos", L.llama_vocab_get_add_eos, L.llama_vocab_eos),
        ):
            if add(vt) != add(vd) or (add(vt) and tok(vt) != tok(vd)):
                return False, f"{what} differs (add {add(vt)} vs {add(vd)}, id {tok(vt)} vs {tok(vd)})"
        nt, nd = L.llama_vocab_n_tokens(vt), L.llama_vocab_n_tokens(vd)
        if abs(nt - nd) > SPEC_VOCAB_MAX_SIZE_DIFFERENCE:
            return False, f"vocabulary sizes {nt} and {nd} differ by more than {SPEC_VOCAB_MAX_SIZE_DIFFERENCE}"
        for i in range(SPEC_VOCAB_CHECK_START_TOKEN_ID, min(nt, nd)):
            a, b = L.llama_vocab_get_text(vt, i), L.llama_vocab_get_text(vd, i)
            if a != b:
                return False, f"token {i} differs: {a!r} vs {b!r}"
        return True, f"compatible: {nt} and {nd} tokens, identical text from id {SPEC_VOCAB_CHECK_START_TOKEN_ID}"
    finally:
        for m in models:
            L.llama_model_free(m)
