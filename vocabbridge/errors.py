"""One exception family. Every message says what went wrong *and* how to fix it.

The CLI prints ``str(error)`` on one line and exits non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations


class VocabBridgeError(Exception):
    """Base class: an error meant to be shown to the user as is."""


class TokenizerSourceError(VocabBridgeError):
    """A tokenizer source that does not exist, cannot be read, or is malformed."""


class UnsupportedTokenizerError(VocabBridgeError):
    """A tokenizer this tool cannot represent faithfully (WordPiece, Unigram, ...)."""


class HubUnavailableError(VocabBridgeError):
    """A hub id was given but the Hugging Face hub cannot be reached (offline, no token...)."""


class MapFileError(VocabBridgeError):
    """A token-map file that is corrupt, truncated, or built for other tokenizers."""


class ModelLoadError(VocabBridgeError):
    """A model that cannot be loaded."""


class RequestError(VocabBridgeError):
    """A generation request that cannot be served (prompt too long, bad parameter...)."""


class ConfigError(VocabBridgeError):
    """Inconsistent options (a drafter without a target, an unknown preset...)."""
