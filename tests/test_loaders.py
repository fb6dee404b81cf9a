"""Every loader, on tokenizers trained in the test, and every loader error."""

import base64
import json

import pytest

from vocabbridge import load_tokenizer
from vocabbridge.errors import HubUnavailableError, TokenizerSourceError, UnsupportedTokenizerError
from vocabbridge.tokenizer.encoding import byte_level_encode


def test_tokenizer_json_file_and_folder_give_the_same_view(tok_dirs, base_view):
    v = load_tokenizer(tok_dirs["base"] / "tokenizer.json")
    assert v.fingerprint == base_view.fingerprint and v.format == "tokenizer.json"
    assert v.roles == base_view.roles  # the folder's tokenizer_config is read next to the file


def _write_slow(folder, view):
    folder.mkdir()
    vocab = {byte_level_encode(t) if i not in view.added_ids else t.decode(): i for i, t in enumerate(view.tokens)}
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges = ["#version: 0.2"] + [f"{byte_level_encode(a)} {byte_level_encode(b)}" for a, b in view.merges]
    (folder / "merges.txt").write_text("\n".join(merges) + "\n", encoding="utf-8")
    added = {
        str(a.id): {
            "content": a.content,
            "special": a.special,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "single_word": False,
        }
        for a in view.added
    }
    cfg = {
        "tokenizer_class": "GPT2Tokenizer",
        "added_tokens_decoder": added,
        "bos_token": "<bos>",
        "eos_token": "[|endofturn|]",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_prefix_space": False,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")


def test_slow_vocab_and_merges_folder(tmp_path, base_view):
    _write_slow(tmp_path / "slow", base_view)
    v = load_tokenizer(tmp_path / "slow")
    assert v.format == "hf-slow"
    assert v.tokens == base_view.tokens and v.merges == base_view.merges
    assert v.roles["eos"] == 4 and v.roles["bos"] == 1
    assert v.encode("give them 안녕") == base_view.encode("give them 안녕")


def test_slow_folder_with_a_bad_merges_line_names_the_line(tmp_path, base_view):
    _write_slow(tmp_path / "slow", base_view)
    with (tmp_path / "slow" / "merges.txt").open("a", encoding="utf-8") as f:
        f.write("onlyonetoken\n")
    with pytest.raises(TokenizerSourceError, match=r"merges.txt:\d+: expected two tokens"):
        load_tokenizer(tmp_path / "slow")


def _write_tiktoken(path, view):
    # Ranks in id order; specials are not part of a rank file.
    lines = [f"{base64.b64encode(view.tokens[i]).decode()} {r}" for r, i in enumerate(view.base_ids)]
    path.write_text("\n".join(lines) + "\n")


def test_tiktoken_rank_file_with_a_named_pattern(tmp_path, base_view):
    p = tmp_path / "base.tiktoken"
    _write_tiktoken(p, base_view)
    v = load_tokenizer(p, pattern="gpt2")
    assert v.format == "tiktoken" and v.size == len(base_view.base_ids)
    assert [v.tokens[r] for r in range(v.size)] == [base_view.tokens[i] for i in base_view.base_ids]
    text = "I'll give them the results 안녕하세요"
    assert v.decode_bytes(v.encode(text)) == text.encode()


def test_tiktoken_without_a_pattern_says_how_to_pass_one(tmp_path, base_view):
    p = tmp_path / "base.tiktoken"
    _write_tiktoken(p, base_view)
    with pytest.raises(TokenizerSourceError, match="--pattern"):
        load_tokenizer(p)


def test_tiktoken_bad_line_is_named(tmp_path):
    p = tmp_path / "bad.tiktoken"
    p.write_text("IQ== 0\nIg== 1\n!!notbase64 2\n")
    with pytest.raises(TokenizerSourceError, match=r"bad.tiktoken:3: the token is not valid base64"):
        load_tokenizer(p, pattern="gpt2")


def test_gguf_tokenizer_metadata(tmp_path, base_view):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "tiny.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(
        [byte_level_encode(t) if i not in base_view.added_ids else t.decode() for i, t in enumerate(base_view.tokens)]
    )
    w.add_token_types([3 if i in base_view.added_ids else 1 for i in range(base_view.size)])
    w.add_token_merges([f"{byte_level_encode(a)} {byte_level_encode(b)}" for a, b in base_view.merges])
    w.add_bos_token_id(1)
    w.add_eos_token_id(4)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    v = load_tokenizer(path)
    assert v.format == "gguf"
    # transformers' converter may append its own unk/eos for llama-architecture files: the view
    # shows what the model actually runs with.
    assert v.tokens[: base_view.size] == base_view.tokens
    assert v.roles["bos"] == 1 and v.roles["eos"] == 4 and v.model_vocab_size == base_view.size
    assert v.decode_bytes(v.encode("give them 안녕")) == "give them 안녕".encode()


def test_not_a_gguf_file(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"not a gguf at all")
    with pytest.raises(TokenizerSourceError, match="x.gguf: not a readable GGUF file"):
        load_tokenizer(p)


def test_missing_path_is_one_clear_error(tmp_path):
    with pytest.raises(TokenizerSourceError, match="no such file or folder"):
        load_tokenizer(tmp_path / "nope" / "tokenizer.json")


def test_truncated_json_names_file_line_and_column(tmp_path, tok_dirs):
    text = (tok_dirs["base"] / "tokenizer.json").read_text()
    p = tmp_path / "tokenizer.json"
    p.write_text(text[: len(text) // 2])
    with pytest.raises(
        TokenizerSourceError, match=r"tokenizer.json: invalid tokenizer.json at line 1, column \d+ \(char \d+\).*truncated"
    ):
        load_tokenizer(p)


def test_json_that_is_not_a_tokenizer(tmp_path):
    p = tmp_path / "tokenizer.json"
    p.write_text('{"hello": 1}')
    with pytest.raises(TokenizerSourceError, match="no 'model' object"):
        load_tokenizer(p)


def test_wordpiece_is_refused_with_a_reason(tmp_path):
    from tokenizers import Tokenizer, models

    p = tmp_path / "tokenizer.json"
    Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]")).save(str(p))
    with pytest.raises(UnsupportedTokenizerError, match="WordPiece, not BPE"):
        load_tokenizer(p)


def test_unigram_is_refused_with_a_reason(tmp_path):
    from tokenizers import Tokenizer, models

    p = tmp_path / "tokenizer.json"
    Tokenizer(models.Unigram([("<unk>", 0.0), ("a", -1.0)], 0, False)).save(str(p))
    with pytest.raises(UnsupportedTokenizerError, match="Unigram, not BPE"):
        load_tokenizer(p)


def test_empty_folder_lists_what_is_expected(tmp_path):
    (tmp_path / "README").write_text("hi")
    with pytest.raises(TokenizerSourceError, match="no tokenizer found.*README"):
        load_tokenizer(tmp_path)


def test_hub_id_offline_says_how_to_get_the_files(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(HubUnavailableError, match=r"HF_HUB_OFFLINE is set.*hf download LGAI-EXAONE/EXAONE-4.0-1.2B"):
        load_tokenizer("LGAI-EXAONE/EXAONE-4.0-1.2B")


def test_hub_id_from_the_local_cache_works_offline(monkeypatch, tmp_path, tok_dirs, base_view):
    # A cache laid out the way huggingface_hub writes it: models--org--name/snapshots/<rev>/...
    import shutil

    repo = tmp_path / "models--acme--tiny"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tok_dirs["base"], snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path))
    v = load_tokenizer("acme/tiny")
    assert v.fingerprint == base_view.fingerprint and v.source == "acme/tiny" and v.format == "hub:tokenizer.json"
