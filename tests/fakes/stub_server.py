"""What the local model-API stubs share (`api_stub` for Anthropic's Messages API,
`responses_stub` for OpenAI's Responses API): a threaded HTTP server on 127.0.0.1 at a
random port, replies a test queues with `push` (then `default`), and every request body kept.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self


def sse(event: str, data: dict[str, Any]) -> bytes:
    """One server-sent event."""
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def chunks(text: str, size: int = 40) -> Iterator[str]:
    """A reply's text in the pieces a stream sends it in."""
    for i in range(0, len(text), size):
        yield text[i: i + size]


class JsonHandler(BaseHTTPRequestHandler):
    """The stubs' request handler: quiet, keep-alive, JSON replies."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr access log."""

    def _send_json(self, status: int, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class ScriptedStub:
    """Use as a context manager. Subclasses name their request `handler` (which finds the
    stub as its `owner`) and may narrow `agent_requests`."""

    handler: ClassVar[type[BaseHTTPRequestHandler]]
    thread_name: ClassVar[str] = "model-stub"
    #: The stub's reply class: made with `text=` from a string (see `coerce`).
    reply_type: ClassVar[type]

    def coerce(self, spec: Any, request: dict[str, Any]) -> Any:
        """A reply from the convenient forms tests write: a reply, a string, a dict (where
        `from_dict` reads one) or callable(request) giving one of those."""
        if callable(spec) and not isinstance(spec, self.reply_type):
            spec = spec(request)
        if isinstance(spec, self.reply_type):
            return spec
        if isinstance(spec, str):
            return self.reply_type(text=spec)
        if isinstance(spec, dict):
            return self.from_dict(spec)
        raise TypeError(f"cannot turn {spec!r} into a stub reply")

    def from_dict(self, spec: dict[str, Any]) -> Any:
        raise TypeError(f"cannot turn {spec!r} into a stub reply")

    def __init__(self, default: Any = "OK") -> None:
        self.default = default
        self.requests: list[dict[str, Any]] = []
        self._replies: deque[Any] = deque()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def push(self, *replies: Any) -> None:
        """Queue replies for the next agent requests."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._replies)

    def agent_requests(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Block until at least n agent requests arrived (for tests that race a stream)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(found := self.agent_requests()) >= n:
                return found
            time.sleep(0.02)
        raise TimeoutError(f"stub saw {len(self.agent_requests())} agent requests, wanted {n}")

    def _queued(self) -> Any:
        """The next queued reply, else `default`."""
        with self._lock:
            return self._replies.popleft() if self._replies else self.default

    @property
    def port(self) -> int:
        assert self._server is not None, "stub not started"
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        handler = type("Handler", (self.handler,), {"owner": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=self.thread_name,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
