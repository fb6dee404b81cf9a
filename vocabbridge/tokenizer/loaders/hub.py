"""Hub ids: fetch only the tokenizer files with huggingface_hub (or take them from its cache),
then read the folder like any local one. Offline, with nothing cached, say how to get the files."""

from __future__ import annotations

import os
from pathlib import Path

from ...errors import HubUnavailableError, TokenizerSourceError
from ..view import TokenizerView
from .hf import load_folder

TOKENIZER_FILES = [
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
    "generation_config.json",
    "*.tiktoken",
]


def load_hub(repo_id: str, *, revision: str | None = None, pattern: str | None = None) -> TokenizerView:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as e:  # pragma: no cover - a dependency of transformers
        raise HubUnavailableError(f"{repo_id}: loading hub ids needs huggingface_hub (pip install huggingface_hub).") from e
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=TOKENIZER_FILES)
    except RepositoryNotFoundError as e:
        raise TokenizerSourceError(
            f"{repo_id}: no such repository on the Hugging Face hub (or it is private: run `hf auth login`)."
        ) from e
    except GatedRepoError as e:
        raise HubUnavailableError(
            f"{repo_id}: the repository is gated; accept its licence on the hub and run `hf auth login`."
        ) from e
    except (LocalEntryNotFoundError, OSError) as e:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub cannot be reached"
        raise HubUnavailableError(
            f"{repo_id}: {why} and the tokenizer is not in the local cache. On a machine with access run "
            f"`hf download {repo_id} --include 'tokenizer*' '*.json' 'merges.txt'` and pass the folder path instead."
        ) from e

    return load_folder(Path(folder), source=repo_id, pattern=pattern, fmt_prefix="hub:")
