"""The payload codec: optional compression and authenticated encryption of stored payloads, with
keys per subject for crypto-shredding (issue 26). Used only by the serializer registry.

A sealed payload is stored with serializer id :data:`CODEC_SERIALIZER_ID` and the manifest
``"<flags>|<inner serializer id>|<inner manifest>"`` (flags: ``e`` encrypted, ``z`` compressed).
Encryption is AES-SIV (RFC 5297, deterministic authenticated encryption; the ``cryptography``
package, extra ``encryption``) with a 512-bit data key per subject (default: the persistence id)
and the subject, the flags, inner serializer id and inner manifest as associated data, so a
payload cannot be moved to another subject or type unnoticed (within one subject and type the
position is not bound: the sequence number is not known yet when a payload is sealed).
Deterministic, because a payload written again must be stored byte for byte the same: that is
what resolving an interrupted write compares. It reveals only that two payloads of one subject
are equal. Data keys are wrapped for storage with AES-256-GCM under the master key (random nonce).

Forgetting a subject deletes its key for good: its payloads read as :class:`Forgotten` values.
"""

from __future__ import annotations

import base64
import os
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import ConfigurationError, SerializationError, SubjectForgotten

CODEC_SERIALIZER_ID = 1_460_303
"""The serializer id of sealed (encrypted and/or compressed) payloads. A JVM reader has no
serializer with this id: it sees opaque bytes (and fails to deserialize them, as it should)."""

KEY_BYTES = 32
"""The master key's size (AES-256-GCM)."""
DATA_KEY_BYTES = 64
"""A subject's data key (AES-SIV with AES-256: two 256-bit halves)."""
_NONCE = 12


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What an encrypted payload of a forgotten subject reads as (its key was deleted for good).

    Entities' event handlers and projection handlers receive it instead of the event, so they can
    skip it or record a placeholder; a projection does not stop on it."""

    subject: str
    manifest: str
    """The event's own manifest (type and version): stored in clear beside the ciphertext."""


@runtime_checkable
class KeyStore(Protocol):
    """Where data keys live. The default is the ``encryption_key`` table (PostgreSQL)."""

    async def data_keys(self, subjects: Sequence[str], *, create: bool) -> dict[str, bytes | None]:
        """The raw 32-byte key of each subject; ``create``: make the missing ones (for writes).
        A forgotten subject maps to None (its key is never made again); one that never had a
        key is left out."""
        ...

    async def forget(self, subject: str) -> bool:
        """Delete the subject's key for good; True if it had one."""
        ...


KeyState = Literal["kept", "forgotten", "none"]
"""A subject's key in the store: kept (its payloads read), forgotten (a tombstone), or none (no
payload of it was ever encrypted, and it is not forgotten)."""


class MasterKey:
    """Wraps data keys for storage (envelope encryption): a key store that holds wrapped keys
    gives nothing away to a reader of its table without the master key (``codec.master_key``)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ConfigurationError(f"the master key must be {KEY_BYTES} bytes (base64 of 32 random bytes)")
        self._aead = _aesgcm(key)

    @classmethod
    def from_base64(cls, text: str) -> MasterKey:
        try:
            raw = base64.b64decode(text, validate=True)
        except ValueError as e:
            raise ConfigurationError(f"codec master_key is not valid base64: {e}") from None
        return cls(raw)

    def wrap(self, subject: str, key: bytes) -> bytes:
        nonce = os.urandom(_NONCE)
        return nonce + bytes(self._aead.encrypt(nonce, key, subject.encode()))

    def unwrap(self, subject: str, wrapped: bytes) -> bytes:
        try:
            return bytes(self._aead.decrypt(wrapped[:_NONCE], wrapped[_NONCE:], subject.encode()))
        except Exception as e:
            raise ConfigurationError(f"the data key of {subject!r} does not open with this master key") from e

    def __repr__(self) -> str:
        return "MasterKey(...)"


class _Key:
    """One subject's cached key (None: forgotten) and when it was loaded. One object per subject
    while anything holds it: a refresh or a forget changes it in place, so its holders see it."""

    __slots__ = ("__weakref__", "at", "key")

    def __init__(self, key: bytes | None, at: float) -> None:
        self.key = key
        self.at = at


KeysInUse = tuple[_Key, ...]
"""What :meth:`PayloadCodec.load` returns: the loaded keys, held by whoever seals or opens with
them (a write, a page of rows) until it is done. The cache finds a held key even after it left
the ``key_cache_size`` most recent ones."""


class KeyCache:
    """Data keys by subject: the ``size`` most recently used, plus every key still in use.

    A key is never evicted while in use: a write or a page holds the keys it loaded
    (:data:`KeysInUse`) until it is done with them, and :meth:`get` finds a held key even after
    it left the ``size`` most recent ones. So a call or a page with more subjects than ``size``
    seals and opens, and concurrent calls do not evict each other's keys.

    A key is checked with the store again when it is older than ``ttl`` seconds at the next load
    that asks for it, so a subject forgotten by another process stops being readable (and
    writable) here within ``ttl``; a forgotten subject stays forgotten (cached for good).
    Decoding uses what is cached, so a page whose keys were loaded decodes even if the ttl
    passes meanwhile."""

    def __init__(self, ttl: float, size: int) -> None:
        self.ttl = ttl
        self.size = size
        self._recent: OrderedDict[str, _Key] = OrderedDict()
        self._live: weakref.WeakValueDictionary[str, _Key] = weakref.WeakValueDictionary()
        """Every key object still referenced: the recent ones and those in use."""

    def get(self, subject: str) -> tuple[bytes | None, bool]:
        """(key, or None if forgotten; known): an unknown subject was never loaded."""
        entry = self._recent.get(subject)
        if entry is not None:
            self._recent.move_to_end(subject)
            return entry.key, True
        entry = self._live.get(subject)  # evicted from the recent ones, still held by its user
        if entry is None:
            return None, False
        return entry.key, True

    def lookup(self, subjects: Iterable[str], now: float) -> tuple[list[_Key], list[str]]:
        """The cached keys of these subjects (hold them while a load awaits: no other load evicts
        them meanwhile), and the subjects to ask the store about: never loaded, or a key older
        than the ttl."""
        live, held, stale = self._live, [], []
        for s in subjects:
            entry = live.get(s)
            if entry is None:
                stale.append(s)
                continue
            held.append(entry)
            if entry.key is not None and now - entry.at > self.ttl:
                stale.append(s)
        return held, stale

    def put(self, keys: dict[str, bytes | None], now: float) -> list[_Key]:
        """Cache loaded keys and return them (the caller holds them while it uses them)."""
        out = []
        for s, k in keys.items():
            entry = self._live.get(s)
            if entry is None:
                entry = self._live[s] = _Key(k, now)
            else:
                entry.key, entry.at = k, now
            self._recent[s] = entry
            self._recent.move_to_end(s)
            out.append(entry)
        while len(self._recent) > self.size:
            self._recent.popitem(last=False)  # a held one is still found (weakly referenced)
        return out

    def forget(self, subject: str) -> None:
        self.put({subject: None}, time.monotonic())


class PayloadCodec:
    """Seals and opens payloads (sync, with cached keys) and loads keys (async, before a page is
    decoded or a write is serialized). ``keys`` None: compression only."""

    def __init__(
        self, keys: KeyStore | None, *, compress_above: int = 0, compression_level: int = 6,
        subject_of: Callable[[str], str] | None = None, cache_ttl: float = 30.0, cache_size: int = 100_000,
    ) -> None:  # fmt: skip
        self.keys = keys
        self.encrypts = keys is not None
        self.compress_above = compress_above
        self.level = compression_level
        self.subject_of = subject_of or _same
        """The subject whose key encrypts a persistence id's payloads (default: the pid itself)."""
        self.cache = KeyCache(cache_ttl, cache_size)
        self._aeads: dict[bytes, Any] = {}
        if self.encrypts:
            _ciphers()  # the optional dependency is there (a clear error if not)

    async def load(self, pids: Iterable[str], *, create: bool) -> KeysInUse:
        """Make the keys of these persistence ids' subjects available to :meth:`seal` / :meth:`open`
        (``create``: for a write, which makes missing keys and refuses forgotten subjects).

        Returns them: hold the result while sealing or opening with them. A held key is never
        evicted, however small ``key_cache_size`` is."""
        if self.keys is None:
            return ()
        subjects = {self.subject_of(p) for p in pids}
        now = time.monotonic()
        held, missing = self.cache.lookup(subjects, now)  # held across the await
        if missing:
            held += self.cache.put(await self.keys.data_keys(sorted(missing), create=create), now)
        if create:
            for s in subjects:
                key, known = self.cache.get(s)
                if not known:
                    raise SerializationError(f"the key store made no key for {s!r} (a write needs one)")
                if key is None:
                    raise SubjectForgotten(s)
        return tuple(held)

    async def key_state(self, subject: str) -> KeyState:
        """What the key store holds for ``subject`` (asked, not cached)."""
        if self.keys is None:
            raise ConfigurationError("this journal does not encrypt: there are no keys")
        got = await self.keys.data_keys([subject], create=False)
        if subject not in got:
            return "none"
        return "forgotten" if got[subject] is None else "kept"

    async def forget(self, subject: str) -> bool:
        if self.keys is None:
            raise ConfigurationError("this journal does not encrypt: there is no key to forget")
        had = await self.keys.forget(subject)  # the store first: a failure leaves the key usable here too
        self.cache.forget(subject)
        return had

    def seal(self, pid: str, ser_id: int, manifest: str, payload: bytes) -> tuple[int, str, bytes]:
        flags = ""
        if self.compress_above and len(payload) > self.compress_above:
            payload = zlib.compress(payload, self.level)
            flags += "z"
        if self.encrypts:
            subject = self.subject_of(pid)
            key, known = self.cache.get(subject)
            if not known:
                raise SerializationError(f"the key of {subject!r} was not loaded before sealing (a caller's bug)")
            if key is None:
                raise SubjectForgotten(subject)
            flags += "e"
            aad = _aad(subject, flags, ser_id, manifest)
            payload = self._aead(key).encrypt(payload, [aad])
        if not flags:
            return ser_id, manifest, payload
        return CODEC_SERIALIZER_ID, f"{flags}|{ser_id}|{manifest}", payload

    def open(self, pid: str | None, manifest: str, payload: bytes) -> tuple[int, str, bytes] | Forgotten:
        """The inner (serializer id, manifest, payload) of a sealed payload, or Forgotten."""
        flags, inner_id, inner = _parse(manifest)
        if "e" in flags:
            if self.keys is None or pid is None:
                raise SerializationError("an encrypted payload: this journal has no key store to read it with")
            subject = self.subject_of(pid)
            key, known = self.cache.get(subject)
            if not known:
                raise SerializationError(f"no key of {subject!r} to read this payload with (none loaded, none stored)")
            if key is None:
                return Forgotten(subject, inner)
            try:
                aad = _aad(subject, flags, inner_id, inner)
                payload = self._aead(key).decrypt(payload, [aad])
            except Exception as e:
                raise SerializationError(f"payload of {pid!r} does not authenticate: {type(e).__name__}") from e
        if "z" in flags:
            payload = zlib.decompress(payload)
        return inner_id, inner, payload

    def _aead(self, key: bytes) -> Any:
        a = self._aeads.get(key)
        if a is None:
            if len(self._aeads) >= self.cache.size:
                self._aeads.clear()
            a = self._aeads[key] = _aead(key)
        return a


def inner_manifest(ser_id: int, manifest: str) -> tuple[str, int, str]:
    """(flags, serializer id, manifest) of a stored row before sealing (flags "" if not sealed)."""
    if ser_id != CODEC_SERIALIZER_ID:
        return "", ser_id, manifest
    return _parse(manifest)


def new_key() -> bytes:
    """A fresh data key for a subject."""
    return os.urandom(DATA_KEY_BYTES)


def _parse(manifest: str) -> tuple[str, int, str]:
    flags, _, rest = manifest.partition("|")
    ident, sep, inner = rest.partition("|")
    if not sep or not ident.lstrip("-").isdigit() or not set(flags) <= {"e", "z"}:
        raise SerializationError(f"not a sealed payload's manifest: {manifest[:40]!r}")
    return flags, int(ident), inner


def _aad(subject: str, flags: str, ser_id: int, manifest: str) -> bytes:
    return f"{subject}\0{flags}\0{ser_id}\0{manifest}".encode()


def _aesgcm(key: bytes) -> Any:
    return _ciphers().AESGCM(key)


def _aead(key: bytes) -> Any:
    return _ciphers().AESSIV(key)


def _ciphers() -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers import aead
    except ImportError as e:
        raise ConfigurationError(
            "payload encryption needs the 'cryptography' package: pip install 'slice-journal[encryption]'"
        ) from e
    return aead


def _same(pid: str) -> str:
    return pid
