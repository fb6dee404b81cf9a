"""How two tokenizers differ and how well a drafter's vocabulary covers a target's, from Python.

    python examples/tokenizer_pair.py DRAFTER TARGET
    python examples/tokenizer_pair.py ../shared/tokenizers/smollm2 ../shared/tokenizers/qwen3

Without arguments it trains two small tokenizers on the spot (no files, no downloads): a
byte-level base and an "EXAONE-4.5-like" extension of it (NFC, a multi-word split regex, new
multi-word tokens, end-of-turn moved and renamed).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from vocabbridge import load_tokenizer
from vocabbridge.diff import diff_tokenizers
from vocabbridge.mapping import build_token_map, compute_coverage, default_texts


def main(argv: list[str]) -> None:
    if len(argv) == 2:
        drafter, target = (load_tokenizer(a) for a in argv)
    else:
        from vocabbridge.testing import make_extended, train_base

        root = Path(tempfile.mkdtemp())
        make_extended(train_base(root / "base"), root / "extended")
        drafter, target = load_tokenizer(root / "base"), load_tokenizer(root / "extended")

    d = diff_tokenizers(drafter, target)
    print(
        f"identical id prefix: {d.vocab.identical_prefix:,} ids; moved {d.vocab.moved:,}; "
        f"only in the drafter {d.vocab.only_a:,}; only in the target {d.vocab.only_b:,}"
    )
    print(f"multi-word tokens: drafter {d.multiword.count_a:,}, target {d.multiword.count_b:,}")
    for row in d.specials.by_role:
        print(
            f"  {row.role:14s} {row.id_a!s:>7} {row.content_a or '':18s} → {row.id_b!s:>7} {row.content_b or '':18s} {row.status}"
        )

    for mode in ("vllm", "bytes"):
        tm = build_token_map(drafter, target, mode=mode)
        cov = compute_coverage(tm, drafter, target, texts=default_texts())
        total = cov.total_text()
        print(
            f"{mode:5s}: {tm.pairs:,} pairs ({cov.pct_target:.1%} of the target vocabulary); "
            f"{total.partnered / total.target_tokens:.1%} of the sample texts' target tokens have a partner; "
            f"input bridge for {len(tm.input_bridge):,} target ids"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
