"""Serving: an OpenAI-compatible HTTP server over the embedded engine (with vLLM's /metrics
names). ``serve --backend vllm`` runs vLLM instead (``vocabbridge.vllm.backend``).

Only this package and the CLI import the web framework.

>>> from vocabbridge.server import create_app, serve_in_thread  # doctest: +SKIP
>>> with serve_in_thread(built, port=0) as srv:  # doctest: +SKIP
...     print(srv.url)
http://127.0.0.1:54321
"""

from __future__ import annotations

__all__ = ["ServerHandle", "create_app", "serve_in_thread"]


def __getattr__(name: str):  # lazy: importing the package does not import FastAPI
    if name == "create_app":
        from .app import create_app

        return create_app
    if name in ("serve_in_thread", "ServerHandle"):
        from . import runner

        return getattr(runner, name)
    raise AttributeError(name)
