"""Serving the control API: the listen address, the token rule, and uvicorn on the runs' loop.

uvicorn runs as a task of the supervisor's own event loop (`serve_app`), so the HTTP handlers
and the runs share it; the supervisor, not uvicorn, owns SIGINT and SIGTERM. The socket is
bound before serving (`bind`), so a bad or busy address is refused at start with one line, and
port 0 gives the chosen port at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from starlette.types import ASGIApp

from fisk_sm.journal.statedir import make_private_directory, open_regular
from fisk_sm.supervisor.api.security import LOOPBACK_NAMES

__all__ = [
    "DEFAULT_LISTEN",
    "ListenError",
    "bind",
    "check_token_rule",
    "is_loopback",
    "parse_allow_host",
    "parse_listen",
    "serve_app",
    "served_hosts",
    "url_of",
    "write_url",
]

DEFAULT_LISTEN = "127.0.0.1:8765"
#: A DNS name, or an IP address (IPv6 in brackets), as it may stand in a `Host` header.
HOST_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,252})|\[[0-9a-f:.]{2,45}\]")
#: Ports a browser leaves out of `Host` (and `Origin`).
DEFAULT_PORTS = (80, 443)


class ListenError(ValueError):
    """A bad `--listen` address, or one that needs a token and has none."""


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[v6]:PORT` for IPv6) as (host, port)."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise ListenError(f"--listen: expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ListenError(f"--listen: the port must be 0-65535, got {port_text!r}")
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_token_rule(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without a token."""
    if not token and not is_loopback(host):
        raise ListenError(
            f"--listen: {host} is not a loopback address; a token is required"
            " (--token-file FILE or $FISK_SM_TOKEN)"
        )


def _host_form(host: str) -> str:
    return f"[{host}]" if ":" in host else host.lower()


def _with_port(names: set[str], port: int) -> set[str]:
    forms = {f"{name}:{port}" for name in names}
    return forms | names if port in DEFAULT_PORTS else forms


def parse_allow_host(text: str, port: int) -> set[str]:
    """The `Host` forms `--allow-host HOST[:PORT]` allows (`[v6]` in brackets; no port: the
    listening `port`)."""
    value = text.strip().lower()
    if ":" not in value or (value.startswith("[") and value.endswith("]")):
        name, given = value, str(port)
    else:
        name, _, given = value.rpartition(":")
    if not HOST_RE.fullmatch(name) or not given.isdigit() or not 0 < int(given) <= 65535:
        raise ListenError(f"--allow-host: expected HOST or HOST:PORT, got {text!r}")
    return _with_port({name}, int(given))


def served_hosts(sock: socket.socket, listen: str, extra: set[str] | None = None) -> frozenset[str]:
    """The `Host` forms the API on `sock` answers: its bound address and the `--listen` name with
    the bound port (known only now, for port 0); `localhost`, `127.0.0.1` and `[::1]` too on
    loopback; and `extra` (from `--allow-host`)."""
    bound, port = sock.getsockname()[:2]
    names = {_host_form(bound), _host_form(listen)}
    if is_loopback(bound) or is_loopback(listen):
        names.update(LOOPBACK_NAMES)
    return frozenset(_with_port(names, port) | (extra or set()))


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); `ListenError` with the reason if it cannot be."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        family, _, _, _, address = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        raise ListenError(f"--listen: {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise ListenError(f"--listen: {host}:{port}: {exc.strerror or exc}") from None
    sock.setblocking(False)
    return sock


def url_of(sock: socket.socket) -> str:
    """`http://HOST:PORT` of a bound socket."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def write_url(path: Path, url: str) -> None:
    """Write the URL file (0600) in its private directory (blocking: call it off the loop)."""
    make_private_directory(path.parent)
    fd = open_regular(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (url + "\n").encode())
    finally:
        os.close(fd)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the supervisor owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_app(app: ASGIApp, sock: socket.socket) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """Serve `app` on `sock` as a task of the running loop; returns once it accepts requests."""
    config = uvicorn.Config(
        app,
        log_config=None,
        log_level="warning",
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=2,
    )
    server = _Server(config)
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # raises why it stopped
            raise ListenError("the control API stopped at start")
        await asyncio.sleep(0.01)
    return server, task
