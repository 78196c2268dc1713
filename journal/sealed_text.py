"""Free text sealed under a subject's key (issue 32): what the library stores beside an event and
that may quote it, such as a projection's dead letter (its error and traceback quote the failing
handler's exception, which often quotes the event's fields). With ``codec.encrypt`` on, such text
is sealed with the key of the event's subject, so forgetting the subject makes it unreadable
wherever it is kept (this database, a replica, a backup), exactly as the event itself.

A sealed text is stored as ``sealed|<flags>|<base64>``: AES-SIV under the subject's data key with
the subject and the text's kind as associated data (see :mod:`journal.codec`). An exception's
message or traceback never starts so (a type name holds no ``|``), so other text passes through.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

from .codec import Forgotten, PayloadCodec
from .errors import SerializationError, SubjectForgotten
from .serialization import SerializerRegistry

PREFIX = "sealed|"
FORGOTTEN_TEXT = "(forgotten: this text was sealed with the key of a subject that is forgotten)"
"""What a sealed text of a forgotten subject reads as (and what is stored for a subject forgotten
before its text was sealed)."""
UNREADABLE_TEXT = "(sealed with the subject's key: open it with codec.encrypt on, as the writers)"
_SER_ID = 0


def is_sealed(text: str) -> bool:
    return text.startswith(PREFIX)


async def seal_texts(serializers: SerializerRegistry, pid: str, texts: Sequence[str], kind: str) -> list[str]:
    """``texts`` sealed with the key of ``pid``'s subject when the journal encrypts (as they are
    when it does not). ``kind`` names what they are (bound to the ciphertext)."""
    codec = serializers.codec
    if codec is None or not codec.encrypts:
        return list(texts)
    try:
        _held = await serializers.load_write_keys([pid])
    except SubjectForgotten:  # forgotten since the event was read: keep nothing of it
        return [FORGOTTEN_TEXT] * len(texts)
    out = []
    for text in texts:
        _, manifest, payload = codec.seal(pid, _SER_ID, kind, text.encode())
        flags = manifest.partition("|")[0]
        out.append(f"{PREFIX}{flags}|{base64.b64encode(payload).decode()}")
    return out


async def open_texts(serializers: SerializerRegistry, pid: str, texts: Sequence[str], kind: str) -> list[str]:
    """The readable form of stored texts: a sealed one opened (or :data:`FORGOTTEN_TEXT`, or
    :data:`UNREADABLE_TEXT` without a key store), any other as it is."""
    if not any(map(is_sealed, texts)):
        return list(texts)
    codec = serializers.codec
    if codec is None or not codec.encrypts:
        return [UNREADABLE_TEXT if is_sealed(t) else t for t in texts]
    _held = await codec.load([pid], create=False)
    return [_open(codec, pid, t, kind) if is_sealed(t) else t for t in texts]


def _open(codec: PayloadCodec, pid: str, text: str, kind: str) -> str:
    flags, _, data = text[len(PREFIX) :].partition("|")
    try:
        opened = codec.open(pid, f"{flags}|{_SER_ID}|{kind}", base64.b64decode(data, validate=True))
    except (binascii.Error, SerializationError) as e:
        return f"(a sealed text that does not open: {e})"
    if isinstance(opened, Forgotten):
        return FORGOTTEN_TEXT
    return opened[2].decode(errors="replace")
