"""A TCP relay between a client and a server that can lose the server's answers (outage tests).

Clients connect to :attr:`Relay.address`; every byte is forwarded both ways. While
:attr:`Relay.losing` is set, what the server sends back is thrown away and the connection is cut
on both sides: the server has done what it was asked (a commit commits) but the client never
learns it, and new connections get no answer to their start-up either. That is the partition in
which a database's answers are lost while its commits go on, unlike a server that is simply
stopped (nothing is done at all).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit


class Relay:
    def __init__(self, target_host: str, target_port: int, unix_socket: str | None = None) -> None:
        self.target = (target_host, target_port)
        self.unix_socket = unix_socket
        self.losing = False
        self.lost_answers = 0
        self._pass_then_lose: int | None = None
        """Server messages thrown away (each cut a connection)."""
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> tuple[str, int]:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def dsn_through(self, dsn: str) -> str:
        """``dsn`` (TCP or a Unix socket's) pointing at the relay instead."""
        parts = urlsplit(dsn)
        user = parts.netloc.rpartition("@")[0]
        host, port = self.address
        query = "&".join(q for q in parts.query.split("&") if q and not q.startswith(("host=", "port=")))
        return urlunsplit(parts._replace(netloc=f"{user}@{host}:{port}", query=query))

    def lose_after(self, answers: int) -> None:
        """Let the server's next ``answers`` reads through and lose the one after (once): a
        statement answered, say, and the answer to what the client sends next lost."""
        self._pass_then_lose = answers

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for t in list(self._pipes):
            t.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            if self.unix_socket is not None:
                server_r, server_w = await asyncio.open_unix_connection(self.unix_socket)
            else:
                server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        up = asyncio.create_task(self._pipe(client_r, server_w, answers=False))
        down = asyncio.create_task(self._pipe(server_r, client_w, answers=True))
        for t in (up, down):
            self._pipes.add(t)
            t.add_done_callback(self._pipes.discard)
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        for w in (client_w, server_w):
            w.close()

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, *, answers: bool) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await r.read(65536):
                if answers and self._pass_then_lose is not None:
                    if self._pass_then_lose == 0:
                        self._pass_then_lose = None
                        self.lost_answers += 1
                        return  # the answer is lost, the connection with it
                    self._pass_then_lose -= 1
                elif answers and self.losing:
                    self.lost_answers += 1
                    return  # the answer is lost, the connection with it
                w.write(data)
                await w.drain()


@contextlib.asynccontextmanager
async def relay_to(dsn: str) -> AsyncIterator[Relay]:
    """A started relay in front of the server of ``dsn``."""
    parts = urlsplit(dsn)
    query = dict(q.split("=", 1) for q in parts.query.split("&") if "=" in q)
    port = int(query.get("port", parts.port or 5432))
    socket_dir = query.get("host", "")
    unix = f"{socket_dir}/.s.PGSQL.{port}" if socket_dir.startswith("/") else None
    relay = Relay(parts.hostname or "127.0.0.1", port, unix)
    await relay.start()
    try:
        yield relay
    finally:
        await relay.close()
