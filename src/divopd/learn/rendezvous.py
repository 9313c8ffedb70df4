"""The learner ranks' rendezvous: a TCP store that listens only on the ``init_method`` host (``init_process_group``'s
own store would listen on every interface).
"""

from __future__ import annotations

import socket
from datetime import timedelta
from urllib.parse import urlsplit

__all__ = ["listen_socket", "rendezvous_store"]


def _host_port(init_method: str) -> tuple[str, int]:
    parts = urlsplit(init_method)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ValueError(f"rendezvous address {init_method!r}: expected tcp://HOST:PORT")
    return parts.hostname, parts.port


def listen_socket(host: str, port: int, backlog: int = 128) -> socket.socket:
    """A TCP socket listening on ``host:port`` only (IPv4 or IPv6, as ``host`` resolves)."""
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def rendezvous_store(init_method: str, rank: int, world_size: int, timeout: timedelta) -> object:
    """The ``TCPStore`` for ``init_process_group(store=...)``: served by rank 0 on the ``init_method`` host only."""
    from torch.distributed import TCPStore

    host, port = _host_port(init_method)
    if rank != 0:
        return TCPStore(host, port, world_size, False, timeout)
    sock = listen_socket(host, port)
    try:
        store = TCPStore(host, port, world_size, True, timeout, master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store's server owns the descriptor now (and closes it when the store ends)
    return store
