"""Small real tokenizers trained on the spot, with known differences, for tests and examples.

Nothing here downloads anything. ``train_base`` trains a byte-level BPE (EXAONE-4.0-like specials
and chat template); ``make_extended`` derives an "EXAONE-4.5-like" tokenizer from it with a known
answer for every diff figure; ``train_sentencepiece`` trains a SentencePiece-style BPE (``▁`` and
``<0xNN>`` byte fallback) on the same text.

>>> base = train_base()  # doctest: +SKIP
>>> ext, facts = make_extended(base)  # doctest: +SKIP
>>> facts.only_b  # doctest: +SKIP
12
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CORPUS = [
    "안녕하세요. 오늘 날씨가 정말 좋네요! 내일 회의는 오후 3시에 시작합니다.",
    "혹시 이 문제에 대해 도움이 필요하시다면 언제든지 문의해 주세요.",
    "추가 정보가 필요하시면 말씀해 주세요. 확인 후 바로 답변 드리겠습니다.",
    "서울의 가을 하늘은 맑고 높습니다. 주말에는 공원에서 산책을 했어요.",
    "이 코드는 입력 문자열을 토큰으로 나누고 결과를 반환합니다.",
    "회의록을 요약하면 다음과 같습니다: 일정 확정, 예산 검토, 다음 회의 준비.",
    "Hello world! It's a beautiful day, isn't it? I'll give them the results tomorrow.",
    "Could you give them a short summary of the meeting and the next steps?",
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Speculative decoding lets a small model draft tokens that a large model verifies.",
    "Please review this pull request: the function returns the wrong value for empty input.",
    "We measured the acceptance rate and the number of target forwards per request.",
    "def tokenize(text):\n    return [t for t in text.split() if t]\n",
    "for i in range(10):\n    print(f'{i:03d}', i * 2)\n",
    "class Cache:\n    def __init__(self, size):\n        self.size = size\n        self.items = {}\n",
    "if x == 0:\n    return None\nelse:\n    return x + 1\n",
    "The year 2026 had 365 days; version 3.14 shipped on 12/01.",
    "東京は日本の首都です。中文文本测试。",
]


def corpus(repeat: int = 20) -> list[str]:
    return CORPUS * repeat


SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "[|endofturn|]"]
EXAONE_LIKE_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "{{ '[|system|]' + eot + '\\n' }}{% endif %}"
    "{{ '[|' + message['role'] + '|]' + message['content'] }}"
    "{% if message['role'] == 'user' %}{{ '\\n' }}{% else %}{{ eot + '\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '[|assistant|]' }}{% endif %}"
)


def _write(folder: Path, doc: dict, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return folder


def train_base(folder: Path | None = None, *, vocab_size: int = 900) -> dict:
    """A byte-level BPE with EXAONE-4.0-like specials. Returns the tokenizer.json dict (and
    writes a folder with tokenizer.json + tokenizer_config.json when ``folder`` is given)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    doc = json.loads(tok.to_str())
    if folder is not None:
        _write(folder, doc, base_config())
    return doc


def base_config() -> dict:
    return {
        "bos_token": "<bos>",
        "eos_token": "[|endofturn|]",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "chat_template": EXAONE_LIKE_TEMPLATE.replace("eot", "'[|endofturn|]'"),
    }


# A multi-word-capable split regex (letters may run across single spaces), like EXAONE 4.5's.
EXTENDED_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+(?: \p{L}+)*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


@dataclass(frozen=True)
class ExtendedFacts:
    """The answers ``diff(base, extended)`` must give."""

    identical_prefix: int
    same_id: int
    moved: int
    only_a: int
    only_b: int
    merges_prefix: int
    merges_shared: int
    merges_only_b: int
    multiword_b: int
    eot_a: int
    eot_b: int
    base_size_a: int
    base_size_b: int


def _bl(s: str) -> str:
    from .tokenizer.encoding import byte_level_encode

    return byte_level_encode(s.encode("utf-8"))


def make_extended(base: dict, folder: Path | None = None) -> tuple[dict, ExtendedFacts]:
    """Derive an EXAONE-4.5-like tokenizer from ``base``:

    - ids 0–3 and every base token kept, except two swapped ids (``moved`` = 2);
    - id 4 (``[|endofturn|]``) becomes ``[unused4]``; ``<|endofturn|>`` is added at the end;
    - merges: the base merges with #40 and #41 swapped (identical prefix 40), then new merges that
      build multi-word tokens (``␠give␠them``) and a few longer single-word tokens;
    - NFC normalizer and a multi-word split regex.
    """
    doc = json.loads(json.dumps(base))
    vocab: dict[str, int] = doc["model"]["vocab"]
    inv = {i: s for s, i in vocab.items()}
    v = max(vocab.values()) + 1
    # Swap the last two base tokens.
    a_id, b_id = v - 2, v - 1
    vocab[inv[a_id]], vocab[inv[b_id]] = b_id, a_id
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    merges[40], merges[41] = merges[41], merges[40]
    new_pairs = [
        (" give", " them"),
        ("give", " them"),
        (" the", " results"),
        (" the", " meeting"),
        (" 도움이", " 필요하시다면"),
        (" 언제든지", " 문의해"),
        (" 주세요", "."),
        (" small", " model"),
        ("The", " quick"),
        (" lazy", " dog"),
        (" next", " steps"),
        (" tokens", " that"),
    ]
    added_new = 0
    multiword = 0
    nid = v
    for left, right in new_pairs:
        lb, rb = _bl(left), _bl(right)
        if lb not in vocab or rb not in vocab or (lb + rb) in vocab:
            raise AssertionError(f"fixture corpus changed: {left!r}+{right!r} not mergeable")
        vocab[lb + rb] = nid
        merges.append(f"{lb} {rb}")
        nid += 1
        added_new += 1
        multiword += any(c.isalpha() for c in left.rstrip()[-1:]) and right.startswith(" ") and right[1:2].isalpha()
    doc["model"]["merges"] = merges
    for t in doc["added_tokens"]:
        if t["id"] == 4:
            t["content"] = "[unused4]"
    vocab.pop("[|endofturn|]", None)
    vocab["[unused4]"] = 4
    eot_b = nid
    vocab["<|endofturn|>"] = eot_b
    doc["added_tokens"].append(
        {
            "id": eot_b,
            "content": "<|endofturn|>",
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
    )
    doc["normalizer"] = {"type": "NFC"}
    doc["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": EXTENDED_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ],
    }
    n_base = v - len(SPECIALS)
    facts = ExtendedFacts(
        identical_prefix=4,
        same_id=n_base - 2,
        moved=2,
        only_a=0,
        only_b=added_new,
        merges_prefix=40,
        merges_shared=len(base["model"]["merges"]),
        merges_only_b=added_new,
        multiword_b=multiword,
        eot_a=4,
        eot_b=eot_b,
        base_size_a=n_base,
        base_size_b=n_base + added_new,
    )
    if folder is not None:
        cfg = base_config() | {
            "eos_token": "<|endofturn|>",
            "chat_template": EXAONE_LIKE_TEMPLATE.replace("eot", "'<|endofturn|>'"),
        }
        _write(folder, doc, cfg)
    return doc, facts


def train_sentencepiece(folder: Path | None = None, *, vocab_size: int = 700) -> dict:
    """A SentencePiece-style BPE (Metaspace ``▁``, ``<0xNN>`` byte fallback) on the same corpus."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size + 256,
        special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
        show_progress=False,
        limit_alphabet=1000,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    doc = json.loads(tok.to_str())
    # Byte pieces are ordinary vocabulary entries in SentencePiece models, not added tokens.
    doc["added_tokens"] = [t for t in doc["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    if folder is not None:
        _write(
            folder,
            doc,
            {
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "chat_template": "{% for m in messages %}{{ '<s>[' + m['role'] + '] ' + m['content'] + '</s>' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<s>[assistant] ' }}{% endif %}",
            },
        )
    return doc


def tiny_model(
    folder: Path,
    tokenizer_dir: Path,
    *,
    seed: int = 0,
    vocab_size: int | None = None,
    layers: int = 2,
    hidden: int = 64,
    max_positions: int = 512,
) -> Path:
    """A randomly initialised Llama-architecture causal LM saved with its tokenizer files, built
    from a config (no download). Random weights are enough for "output equals plain greedy"."""
    import shutil

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from .tokenizer import load_tokenizer

    view = load_tokenizer(tokenizer_dir)
    cfg = LlamaConfig(
        vocab_size=vocab_size or view.size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        bos_token_id=view.roles.get("bos"),
        eos_token_id=view.roles.get("eos"),
        pad_token_id=view.roles.get("pad"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # sharper logits than the default init, so greedy paths are not all ties
        model.lm_head.weight.mul_(20.0)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, folder / f.name)
    return folder
