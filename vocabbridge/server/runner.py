"""Run the app with uvicorn in a background thread (tests, benchmarks, and ``vocabbridge serve``).

>>> with serve_in_thread(built) as srv:  # doctest: +SKIP
...     httpx.get(srv.url + "/health").status_code
200
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import uvicorn

from ..errors import VocabBridgeError
from .app import create_app

T = TypeVar("T")


class ServerHandle:
    """A running server: ``url``, ``stop()``; a context manager that stops it on exit."""

    def __init__(self, server, thread: threading.Thread, sock: socket.socket, host: str, port: int, app):
        self.server, self.thread, self.sock, self.host, self.port, self.app = server, thread, sock, host, port, app
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    @property
    def model_name(self) -> str:
        return self.app.state.vocabbridge.model_name

    @property
    def worker(self):
        return self.app.state.vocabbridge.worker

    def run_engine(self) -> None:
        """Serve requests on this thread until :meth:`stop` is called from another (a server started
        with ``engine_thread=False``); see :class:`~vocabbridge.server.worker.EngineWorker`."""
        self.worker.run()

    def run_with_engine_here(self, fn: Callable[[], T]) -> T:
        """``fn()`` in a helper thread while this thread runs the engine (a client of this server in
        the same process, as the bench's in-process launch); returns or raises what ``fn`` did."""
        box: dict = {}

        def call():
            try:
                box["result"] = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the caller below
                box["error"] = e
            finally:
                self.worker.stop()

        helper = threading.Thread(target=call, name="vocabbridge-client", daemon=True)
        helper.start()
        self.run_engine()  # until call() is done (or Ctrl-C here)
        helper.join()
        if "error" in box:
            raise box["error"]
        return box["result"]

    def stop(self, timeout: float = 15.0) -> None:
        """Abort the requests still generating (their clients get a 503 error), stop uvicorn, join its thread."""
        self.app.state.vocabbridge.worker.stop()
        self.server.should_exit = True
        self.thread.join(timeout)
        self.sock.close()

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def bind(host: str, port: int) -> socket.socket:
    """A listening-ready socket on ``host:port`` (0 = any free port); a clear error when taken."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        raise VocabBridgeError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or --host.") from None
    return sock


def serve_in_thread(
    built,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    sock: socket.socket | None = None,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_num_seqs: int = 8,
    max_queued_tokens: int | None = None,
    log_level: str = "warning",
    access_log: bool = False,
    startup_timeout: float = 60.0,
    engine_thread: bool = True,
) -> ServerHandle:
    """Start uvicorn serving ``built`` in a daemon thread; return once it accepts connections.

    ``sock``: an already bound socket (see :func:`bind`) instead of ``host``/``port``.
    ``engine_thread=False``: the engine loop does not start; the caller runs it on its own thread
    (:meth:`ServerHandle.run_engine`, :meth:`ServerHandle.run_with_engine_here`).
    """

    app = create_app(
        built,
        served_model_name=served_model_name,
        api_key=api_key,
        max_num_seqs=max_num_seqs,
        max_queued_tokens=max_queued_tokens,
        engine_thread=engine_thread,
    )
    if sock is None:
        sock = bind(host, port)
    port = sock.getsockname()[1]  # the URL keeps the host as given ("localhost" stays "localhost")
    config = uvicorn.Config(app, log_level=log_level, access_log=access_log, lifespan="on", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="vocabbridge-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise VocabBridgeError(f"the HTTP server on {host}:{port} did not start; run with --debug for the log.")
        time.sleep(0.01)
    return ServerHandle(server, thread, sock, host, port, app)
