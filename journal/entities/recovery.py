"""Recovery: the newest snapshot that loads (older kept ones next), then later events replayed
in bounded batches; retried while the database is unavailable."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ..codec import CODEC_SERIALIZER_ID
from ..errors import JournalUnavailable, RecoveryFailed, SerializationError
from ..journal import Journal
from ..settings import EntitySettings
from .entity import Entity, apply_event, bookkeeping, end_command, outside_command, set_sequence_nr
from .routing import restore_route_marks

log = logging.getLogger("journal.entities")


async def recover(entity: Entity[Any], journal: Journal, settings: EntitySettings) -> None:
    """Bring ``entity`` to the journal's state, retrying while the database is unavailable.

    Raises :class:`RecoveryFailed` (with pid and, for a failing event handler, seq_nr).
    """
    pid = entity.persistence_id
    for attempt in range(1, settings.replay_retry_max + 1):
        try:
            await _recover_once(entity, journal, settings)
            return
        except JournalUnavailable as e:
            if attempt >= settings.replay_retry_max:
                raise RecoveryFailed(pid, None, f"journal unavailable after {attempt} attempts: {e}") from e
            log.warning(
                "recovery of %s: %s; retry %d in %.1fs",
                pid,
                e,
                attempt,
                settings.replay_retry_delay,
            )
            await asyncio.sleep(settings.replay_retry_delay)
            entity.state = entity.initial_state()
            bookkeeping(entity).load_metadata(None, journal.serializers, pid)
            set_sequence_nr(entity, 0)


async def _recover_once(entity: Entity[Any], journal: Journal, settings: EntitySettings) -> None:
    pid = entity.persistence_id
    seq = 0
    _held = await journal.serializers.load_keys([(pid, CODEC_SERIALIZER_ID)])  # for the snapshot's bookkeeping
    for snap in await journal.load_snapshots(pid, settings.snapshots_per_emitter_max):
        if isinstance(snap, SerializationError):
            log.warning("a snapshot of %s does not load (%s): trying an older one", pid, snap)
            continue
        try:
            entity.state = entity.restore_snapshot(snap.state)
            bookkeeping(entity).load_metadata(snap.metadata, journal.serializers, pid)
            restore_route_marks(entity, snap.metadata)
        except Exception as e:
            log.warning("snapshot of %s at %d does not restore (%s): trying an older one", pid, snap.seq_nr, e)
            entity.state = entity.initial_state()
            bookkeeping(entity).load_metadata(None, journal.serializers, pid)
            continue
        seq = snap.seq_nr
        break
    highest = await journal.highest_seq_nr(pid)
    start = max(seq + 1, entity.replay_from_seq_nr)
    batch = settings.replay_batch_size
    token = outside_command()
    try:
        while start <= highest:
            upper = min(start + batch - 1, highest)
            async for env in journal.current_events_by_persistence_id(pid, start, upper):
                try:
                    apply_event(entity, env, replay=True)
                except Exception as e:
                    raise RecoveryFailed(pid, env.seq_nr, f"event handler raised {type(e).__name__}: {e}") from e
                set_sequence_nr(entity, env.seq_nr)
            start = upper + 1
    finally:
        end_command(token)
    set_sequence_nr(entity, max(highest, seq))
