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


class InputFileError(VocabBridgeError):
    """A text or prompt file given on the command line that cannot be read."""


class ConfigError(VocabBridgeError):
    """Inconsistent options (a drafter without a target, an unknown preset...)."""


# ==== vocabbridge bench =====================================================================


class BenchError(VocabBridgeError):
    """A benchmark that cannot run as asked."""


class PromptFileError(BenchError):
    """A prompt file that cannot be read or has a malformed line (the message names the line)."""


class MetricsError(BenchError):
    """A /metrics page that is not Prometheus text."""


class ServerError(BenchError):
    """A server that cannot be reached or refuses a benchmark request."""


class LaunchError(BenchError):
    """A server configuration that could not be started (the message shows its last output lines)."""
