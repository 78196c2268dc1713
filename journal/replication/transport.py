"""gRPC transport between endpoints: a hand-written generic handler with bytes messages (no codegen).

Service ``slicejournal.Replication``: ``Read`` (a :class:`ReadRequest` -> a batch), ``Info``
(the endpoint's status as JSON) and ``Watch`` (a stream of log names, one per local change:
update notifications). TLS when configured; plaintext otherwise.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import orjson

from ..errors import ConfigurationError, IncompatibleVersion, JournalUnavailable, ReplicationError
from ..replicated import ReplicationBatch
from .config import TlsConfig
from .replicator import ReadRequest
from .wire import decode_batch, decode_read, encode_batch, encode_read

SERVICE = "slicejournal.Replication"
_INCOMPATIBLE = "incompatible-version: "
_MAX_MESSAGE = 64 * 1024 * 1024
_OPTIONS = [("grpc.max_send_message_length", _MAX_MESSAGE), ("grpc.max_receive_message_length", _MAX_MESSAGE)]


def _pem(tls: TlsConfig, key: str) -> bytes:
    """One of the TLS files; one that cannot be read is a ConfigurationError naming its key."""
    path: Path = getattr(tls, key)
    try:
        return path.read_bytes()
    except OSError as e:
        raise ConfigurationError(f"tls.{key}: cannot read {path}: {e.strerror or e}") from e


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(_pem(tls, "key"), _pem(tls, "cert"))], _pem(tls, "ca"))


def channel(address: str, tls: TlsConfig | None) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=_OPTIONS)
    creds = grpc.ssl_channel_credentials(_pem(tls, "ca"), _pem(tls, "key"), _pem(tls, "cert"))
    options = [*_OPTIONS, *([("grpc.ssl_target_name_override", tls.server_name)] if tls.server_name else [])]
    return grpc.aio.secure_channel(address, creds, options=options)


def generic_handler(
    read: Callable[[ReadRequest], Awaitable[ReplicationBatch]],
    info: Callable[[], Awaitable[dict[str, Any]]],
    watch: Callable[[], AsyncIterator[str]],
) -> grpc.GenericRpcHandler:
    async def on_read(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return encode_batch(await read(decode_read(request)))
        except IncompatibleVersion as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, _INCOMPATIBLE + str(e))
        except ReplicationError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except JournalUnavailable as e:  # this location's database is away: say so, no traceback
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        raise AssertionError("unreachable")

    async def on_info(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        try:
            return orjson.dumps(await info())
        except JournalUnavailable as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
        raise AssertionError("unreachable")

    async def on_watch(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        async for log_name in watch():
            yield log_name.encode()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Read": grpc.unary_unary_rpc_method_handler(on_read),
            "Info": grpc.unary_unary_rpc_method_handler(on_info),
            "Watch": grpc.unary_stream_rpc_method_handler(on_watch),
        },
    )


class RemoteSource:
    """A :class:`LogSource` over gRPC: a remote endpoint's logs."""

    def __init__(self, address: str, tls: TlsConfig | None, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = channel(address, tls)
        self._read = self._channel.unary_unary(f"/{SERVICE}/Read")
        self._info = self._channel.unary_unary(f"/{SERVICE}/Info")
        self._watch = self._channel.unary_stream(f"/{SERVICE}/Watch")
        self._location: str | None = None

    async def close(self) -> None:
        await self._channel.close()

    async def info(self) -> dict[str, Any]:
        try:
            result: dict[str, Any] = orjson.loads(await self._info(b"", timeout=self.timeout))
        except grpc.aio.AioRpcError as e:
            raise JournalUnavailable(f"endpoint {self.address}: {e.code().name} {e.details()}") from e
        return result

    async def location(self) -> str:
        if self._location is None:
            self._location = str((await self.info())["location"])
        return self._location

    async def read(self, request: ReadRequest) -> ReplicationBatch:
        try:
            return decode_batch(await self._read(encode_read(request), timeout=self.timeout))
        except grpc.aio.AioRpcError as e:
            details = e.details() or ""
            if e.code() == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(_INCOMPATIBLE):
                raise IncompatibleVersion(details[len(_INCOMPATIBLE) :]) from e
            raise JournalUnavailable(f"endpoint {self.address}: {e.code().name} {details}") from e

    async def watch(self) -> AsyncIterator[str]:
        """Log names as the remote endpoint's logs change; ends (raises) when the stream breaks."""
        try:
            async for message in self._watch(b""):
                yield bytes(message).decode()
        except grpc.aio.AioRpcError as e:
            raise JournalUnavailable(f"endpoint {self.address}: watch {e.code().name}") from e
        except asyncio.CancelledError:
            raise
