"""A loopback HTTP server whose clients may leave before their answer: a machine deleted mid-request, a hanging GET
given up. That is no error of the server's, and prints nothing."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipeError, ConnectionResetError, ...
            super().handle_error(request, client_address)
