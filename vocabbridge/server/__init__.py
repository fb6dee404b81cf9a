"""Serving: an OpenAI-compatible HTTP server over the embedded engine (with vLLM's /metrics
names), and a launcher that runs ``vllm serve`` with the matching ``--speculative-config``.

Only this package and the CLI import the web framework; ``vllm_backend`` imports neither.

>>> from vocabbridge.server import create_app, serve_in_thread  # doctest: +SKIP
>>> with serve_in_thread(built, port=0) as srv:  # doctest: +SKIP
...     print(srv.url)
http://127.0.0.1:54321
"""

from __future__ import annotations

__all__ = ["ServerHandle", "create_app", "serve_in_thread"]


def __getattr__(name: str):  # lazy: `vllm_backend` users do not pay for importing FastAPI
    if name == "create_app":
        from .app import create_app

        return create_app
    if name in ("serve_in_thread", "ServerHandle"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
