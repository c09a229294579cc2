"""What the local servers share: the loopback address, free ports, the health check, the error type."""

from __future__ import annotations

import errno
import socket
import urllib.error
import urllib.request

from tracker.base.errors import TrackerError

HOST = "127.0.0.1"


class LocalServerError(TrackerError, RuntimeError):
    """The local PostgreSQL cluster or MLflow server could not be started."""


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def require_free_port(port: int) -> None:
    """Raises `LocalServerError` unless `port` on 127.0.0.1 can be listened on now.

    Bound as uvicorn and PostgreSQL bind (SO_REUSEADDR), so that connections of a server that ended do not count.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise LocalServerError(f"port {port} on {HOST} is already in use (by another service)") from None
            raise LocalServerError(f"port {port} on {HOST} cannot be listened on: {e.strerror}") from None


def health_ok(uri: str, *, timeout_s: float = 2.0) -> bool:
    """Whether `uri`/health answers 200 (directly: loopback never goes through a proxy)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
