"""The benchmark's errors: each says what went wrong and how to fix it (shown as one line)."""

from __future__ import annotations

from ..errors import VocabBridgeError


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
