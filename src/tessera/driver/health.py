"""The node driver's ``/healthz``, ``/livez`` and ``/readyz`` over plain HTTP/1.0
(socketserver: the http.server module alone costs a node agent half a second of start-up)."""

from __future__ import annotations

import json
import socketserver
from collections.abc import Callable
from typing import Any

from .context import DriverStartError

#: ``() -> (live, ready, details)``: what the endpoints answer (``details``: JSON-able).
HealthFn = Callable[[], tuple[bool, bool, dict[str, Any]]]


class HealthEndpoint:
    """The listening socket, bound at construction (a taken port refuses the start before
    anything is written, published or made) and served by :meth:`serve_forever`. Raises
    :class:`~.context.DriverStartError` when ``address`` (``host:port``) cannot be bound."""

    def __init__(self, address: str, health: HealthFn) -> None:
        host, _, port = address.rpartition(":")

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(8192).decode("latin-1").split()
                while self.rfile.readline(8192).strip():
                    pass  # headers
                path = line[1].split("?")[0] if len(line) >= 2 and line[0] == "GET" else ""
                live, ready, details = health()
                ok = {"/healthz": live, "/livez": live, "/readyz": ready}.get(path)
                if ok is None:
                    status, body = "404 Not Found", b'{"error": "not found"}\n'
                else:
                    status = "200 OK" if ok else "503 Service Unavailable"
                    body = (json.dumps({"ok": ok, **details}) + "\n").encode()
                self.wfile.write(
                    f"HTTP/1.0 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        try:
            self.server = Server((host or "127.0.0.1", int(port)), Handler)
        except OSError as e:
            raise DriverStartError(f"--health-address {address}: {e.strerror}") from e

    @property
    def port(self) -> int:
        """The port it listens on (the one asked for, or the one given for port 0)."""
        return int(self.server.server_address[1])

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def shutdown(self) -> None:
        """Stop serving (from another thread than :meth:`serve_forever`'s) and close."""
        self.server.shutdown()
        self.server.server_close()

    def close(self) -> None:
        """Close the socket of an endpoint never served."""
        self.server.server_close()
