"""Hub ids: fetch only the tokenizer files with huggingface_hub (or take them from its cache),
then read the folder like any local one. Offline, with nothing cached, say how to get the files.

huggingface_hub retries a failed connection five times (about 30 s) for every file; so the hub is
tried once per process with one short request (:func:`hub_unreachable`), and when it cannot be
reached (or ``HF_HUB_OFFLINE`` is set) only the local cache is read: an answer in seconds.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from urllib.parse import urlsplit

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


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def hub_unreachable() -> str | None:
    """Why the hub cannot be used now (``HF_HUB_OFFLINE``, or a request to it that failed to
    connect: tried once per process and endpoint), or None."""
    if hub_offline():
        return "HF_HUB_OFFLINE is set"
    return _probe(os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/"))


@functools.cache
def _probe(endpoint: str, timeout: float = 5.0) -> str | None:
    import httpx

    try:
        httpx.head(endpoint, timeout=timeout)  # any HTTP answer, even an error status, means it is reachable
    except httpx.HTTPError as e:  # through the proxies (HTTPS_PROXY) huggingface_hub would use too
        return f"the hub ({urlsplit(endpoint).netloc or endpoint}) cannot be reached ({type(e).__name__}: {e or 'no answer'})"
    return None


def hub_model_kwargs(repo_id: str) -> dict:
    """``from_pretrained`` keywords for a hub model: local files only when the hub cannot be
    reached (no half minute of retries), and a clear error at once when they are not cached either."""
    why = hub_unreachable()
    if why is None:
        return {}
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        raise HubUnavailableError(
            f"{repo_id}: {why}, and the model is not in the local hub cache. On a machine with access run "
            f"`hf download {repo_id}` and pass the folder, or give a .gguf file (a preset finds its GGUF file "
            "in VOCABBRIDGE_MODELS)."
        )
    return {"local_files_only": True}


def load_hub(repo_id: str, *, revision: str | None = None, pattern: str | None = None) -> TokenizerView:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError
    except ImportError as e:  # pragma: no cover - a dependency of transformers
        raise HubUnavailableError(f"{repo_id}: loading hub ids needs huggingface_hub (pip install huggingface_hub).") from e
    why = hub_unreachable()
    try:
        folder = snapshot_download(repo_id, revision=revision, allow_patterns=TOKENIZER_FILES, local_files_only=why is not None)
    except RepositoryNotFoundError as e:
        raise TokenizerSourceError(
            f"{repo_id}: no such repository on the Hugging Face hub (or it is private: run `hf auth login`)."
        ) from e
    except GatedRepoError as e:
        raise HubUnavailableError(
            f"{repo_id}: the repository is gated; accept its licence on the hub and run `hf auth login`."
        ) from e
    except (LocalEntryNotFoundError, OSError) as e:
        why = why or "the hub cannot be reached"
        raise HubUnavailableError(
            f"{repo_id}: {why} and the tokenizer is not in the local cache. On a machine with access run "
            f"`hf download {repo_id} --include 'tokenizer*' '*.json' 'merges.txt'` and pass the folder path instead."
        ) from e

    return load_folder(Path(folder), source=repo_id, pattern=pattern, fmt_prefix="hub:")
