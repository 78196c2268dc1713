"""A local TCP bridge to a PostgreSQL server that only listens on a Unix socket.

JDBC cannot open Unix sockets without extra jars, and the embedded PostgreSQL listens only on
one. For a local Spark (``local[*]``, executors in this machine's JVM) a loopback TCP port that
forwards bytes to the socket is enough; it lives in a daemon thread as long as this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from pathlib import Path

from journal.errors import SparkSetupError

log = logging.getLogger("projections.spark.bridge")

_bridges: dict[Path, int] = {}
_lock = threading.Lock()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def tcp_bridge(socket_path: Path) -> int:
    """A 127.0.0.1 port that forwards to ``socket_path`` (one bridge per socket, reused)."""
    socket_path = Path(socket_path)
    with _lock:
        if socket_path in _bridges:
            return _bridges[socket_path]
        started = threading.Event()
        port_box: list[int] = []

        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_unix_connection(str(socket_path))
            except OSError as e:
                log.warning("bridge cannot reach %s: %s", socket_path, e)
                w.close()
                return
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))

        async def serve() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            port_box.append(server.sockets[0].getsockname()[1])
            started.set()
            async with server:
                await server.serve_forever()

        t = threading.Thread(target=lambda: asyncio.run(serve()), name=f"pg-bridge-{socket_path}", daemon=True)
        t.start()
        started.wait(10)
        if not port_box:
            raise SparkSetupError(
                f"the TCP bridge to the database socket {socket_path} did not start within 10 s: "
                "give Spark a TCP DSN (host and port) instead"
            )
        _bridges[socket_path] = port_box[0]
        return port_box[0]
