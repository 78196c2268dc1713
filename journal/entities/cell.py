"""One live entity: its command queue, its write path and its restarts.

stateSync=True: one command at a time; the next command starts only after the previous
command's events are written and applied. stateSync=False: commands are handled as they
arrive (against state that may lack events still being written); the events of every command
handled while a write is in flight go into the *next* persist call, so several commands of one
entity share one atomic write (and, through the journal's group commit, one statement with
other entities' writes).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import tracing
from ..envelope import EventEnvelope
from ..errors import (
    EntityStopped,
    JournalError,
    JournalUnavailable,
    RecoveryFailed,
    SequenceConflict,
    StashTimeout,
)
from ..journal import Journal
from ..settings import EntitySettings
from ..vector_time import VectorTime
from .circuit_breaker import CircuitBreaker
from .conditional import TimedReply
from .confirmed_delivery import Deliverer, Destination
from .delivery import RoutedDelivery, routed_handler
from .entity import (
    AfterPersist,
    Collected,
    Entity,
    apply_behaviours,
    apply_event,
    begin_command,
    bookkeeping,
    end_command,
    outside_command,
    set_sequence_nr,
    undo_behaviours,
)
from .recovery import recover
from .reliable import CONFIRMS_KEY, ON_EVENT_KEY, with_marks
from .routing import routes_metadata, snapshot_route_metadata
from .snapshot_result import SnapshotResult

log = logging.getLogger("journal.entities")


@dataclass(eq=False)
class _Command:
    command: Any
    future: asyncio.Future[Any]
    collected: Collected | None = None
    reply: Any = None
    timed: bool = False
    trace: Any = None
    """The asker's trace context while tracing is on (:mod:`journal.tracing`), else None."""
    undo: _Undo | None = None


@dataclass
class _Undo:
    """What a command handler changed besides events, undone if the command's write fails."""

    behaviours_before: tuple[Any, ...]
    behaviours_after: tuple[Any, ...]
    unstashed: list[_Command]


_FLUSH = object()
"""The internal command that writes the follow-ups asked for with ``persist_on_event``."""


class EntityCell:
    """Owns one entity instance; the registry keeps at most one cell per pid."""

    def __init__(
        self,
        factory: Callable[[str], Entity[Any]],
        entity_id: str,
        journal: Journal,
        settings: EntitySettings,
        breaker: CircuitBreaker,
        on_stopped: Callable[[EntityCell], None],
        destinations: Mapping[str, Destination] | None = None,
    ) -> None:
        self._factory = factory
        self.entity_id = entity_id
        self.entity = factory(entity_id)
        self.persistence_id = self.entity.persistence_id
        self._journal = journal
        self._settings = settings
        self._breaker = breaker
        self._on_stopped = on_stopped
        cls = type(self.entity)
        self.state_sync = settings.state_sync if cls.state_sync is None else cls.state_sync
        self.snapshot_every = settings.snapshot_every if cls.snapshot_every is None else cls.snapshot_every
        self._queue: deque[_Command] = deque()
        self._wake = asyncio.Event()
        self._pending: list[_Command] = []  # stateSync=False: handled, not yet written
        self._stash: deque[_Command] = deque()  # stashed by the entity, replies pending
        self._stash_timers: dict[_Command, asyncio.TimerHandle] = {}
        self.stash_timeout = settings.stash_timeout if cls.stash_timeout is None else cls.stash_timeout
        self._writer: asyncio.Task[None] | None = None
        self._needs_restart = False
        self._stopping = False
        self._background: set[asyncio.Task[None]] = set()
        self._snapshot_lock = asyncio.Lock()
        self.recovered = asyncio.Event()
        self.failure: RecoveryFailed | None = None
        """Why recovery failed (set with ``recovered``), else None."""
        self.restarts = 0
        self.last_used = time.monotonic()
        interval = cls.redeliver_interval or settings.redeliver_interval
        self.deliveries = Deliverer(self.persistence_id, lambda: bookkeeping(self.entity), destinations or {}, interval)
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"entity {self.persistence_id}")

    # -- API used by the registry ----------------------------------------------------------

    def submit(self, command: Any, *, timed: bool = False) -> asyncio.Future[Any]:
        """Queue ``command``; with ``timed`` the reply is a :class:`TimedReply`."""
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Command(command, fut, timed=timed, trace=tracing.capture() if tracing.ON else None))
        self.last_used = time.monotonic()
        self._wake.set()
        return fut

    @property
    def idle(self) -> bool:
        return (
            not self._queue
            and all(c.future.done() for c in self._stash)  # only callers that gave up
            and not self._pending
            and (self._writer is None or self._writer.done())
            and not self.deliveries.pending
        )

    def unconfirmed_from(self) -> int | None:
        """The seq_nr of the oldest event whose delivery is unconfirmed (None: none is)."""
        return min((u.seq_nr for u in bookkeeping(self.entity).unconfirmed.values()), default=None)

    async def stop(self) -> None:
        """Finish queued commands and writes, then stop."""
        self._stopping = True
        self._wake.set()
        await asyncio.gather(self._task, return_exceptions=True)

    # -- the loop ---------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            if not await self._recover():
                return
            while True:
                if not self._queue:
                    if self._stopping:
                        break
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                if self._needs_restart:
                    await self._drain_writer()
                    if not await self._restart():
                        return
                cmd = self._queue.popleft()
                if cmd.future.done():  # the caller gave up before the command ran
                    continue
                if cmd.trace is None:
                    await self._step(cmd)
                else:
                    await self._traced_step(cmd)
            await self._drain_writer()
            stashed = self._take_stash()
            self._fail(stashed, EntityStopped(f"{self.persistence_id!r} stopped with this command stashed"))
            if self._background:
                await asyncio.gather(*self._background, return_exceptions=True)
        finally:
            await self.deliveries.stop()  # also when a restart's recovery failed
            self._on_stopped(self)

    async def _recover(self) -> bool:
        try:
            await recover(self.entity, self._journal, self._settings)
        except RecoveryFailed as e:
            self._fail_recovery(e)
            return False
        except Exception as e:  # a bug in restore/initial_state: still reported, never used
            self._fail_recovery(RecoveryFailed(self.persistence_id, None, f"{type(e).__name__}: {e}"))
            return False
        changes, token = begin_command(self.entity, after_write=True)  # may restore a behaviour
        try:
            self.entity.on_recovery(None)
        finally:
            end_command(token)
        self._make_changes(changes)
        self.recovered.set()
        self._enqueue_follow_ups()
        self.deliveries.recovered()
        return True

    def _fail_recovery(self, e: RecoveryFailed) -> None:
        log.error("%s", e)
        self.failure = e
        try:
            self.entity.on_recovery(e)
        except Exception:
            log.exception("on_recovery of %s raised", self.persistence_id)
        while self._queue:
            cmd = self._queue.popleft()
            if not cmd.future.done():
                cmd.future.set_exception(e)
        self.recovered.set()

    async def _restart(self) -> bool:
        """Another writer changed this pid: throw the instance away and recover a new one."""
        log.info("restarting %s from the journal", self.persistence_id)
        self.restarts += 1
        self._needs_restart = False
        self._unstash()  # the new instance decides about them again
        self.entity = self._factory(self.entity_id)
        return await self._recover()

    async def _step(self, cmd: _Command) -> None:
        """One command: handled, then written (state_sync) or queued for the writer."""
        handled = await self._handle(cmd)
        if handled is None:
            return
        if self.state_sync:
            await self._write([handled])
        else:
            self._pending.append(handled)
            self._kick_writer()

    async def _traced_step(self, cmd: _Command) -> None:
        """:meth:`_step` in an ``entity.command`` span, a child of the asker's context: its write
        (and so the read model's handling of its events) joins the asker's trace."""
        with tracing.span("entity.command", parent=cmd.trace, attributes={"persistence_id": self.persistence_id}):
            await self._step(cmd)

    # -- commands ---------------------------------------------------------------------------

    async def _handle(self, cmd: _Command) -> _Command | None:
        """Run the command handler; return the command if it has events to write."""
        if cmd.command is _FLUSH:
            return self._flush(cmd)
        if isinstance(cmd.command, RoutedDelivery) and not self.state_sync:
            await self._drain_writer()  # the dedupe check needs every earlier write applied
        collected, token = begin_command(self.entity)
        try:
            handler = routed_handler(self.entity, cmd.command) or self.entity.current_command_handler()
            reply = handler(cmd.command)
            if inspect.isawaitable(reply):
                reply = await reply
        except Exception as e:
            if not cmd.future.done():
                cmd.future.set_exception(e)
            return None
        finally:
            end_command(token)
        cmd.collected, cmd.reply = collected, reply
        undo = self._make_changes(collected)
        if collected.stash:
            self._stash_one(cmd)
            return None
        if collected.events:
            cmd.undo = undo  # if the write fails
            return cmd
        if collected.snapshot:
            await self._save_snapshot()
        self._reply(cmd)
        return None

    def _make_changes(self, c: Collected) -> _Undo:
        """What a handler asked for besides events: behaviour changes, unstashing, redelivery."""
        before, after = apply_behaviours(self.entity, c.behaviours)
        unstashed = self._unstash() if c.unstash else []
        if c.redeliver:
            self.deliveries.redeliver_now()
        return _Undo(before, after, unstashed)

    def _undo(self, batch: list[_Command]) -> None:
        """The batch's write failed: its commands' behaviour changes and unstashing are undone
        (the unstashed commands not handled yet go back to the stash)."""
        for cmd in reversed(batch):
            if cmd.undo is None:
                continue
            undo_behaviours(self.entity, cmd.undo.behaviours_before, cmd.undo.behaviours_after)
            back = [c for c in cmd.undo.unstashed if c in self._queue]
            for c in back:
                self._queue.remove(c)
            for c in reversed(back):
                self._stash_one(c, first=True)
            cmd.undo = None

    def _stash_one(self, cmd: _Command, *, first: bool = False) -> None:
        if first:
            self._stash.appendleft(cmd)
        else:
            self._stash.append(cmd)
        if self.stash_timeout:
            loop = asyncio.get_running_loop()
            self._stash_timers[cmd] = loop.call_later(self.stash_timeout, self._stash_expired, cmd)

    def _stash_expired(self, cmd: _Command) -> None:
        if cmd not in self._stash_timers:
            return
        del self._stash_timers[cmd]
        self._stash.remove(cmd)
        self._fail([cmd], StashTimeout(f"a command to {self.persistence_id!r} stayed stashed {self.stash_timeout}s"))

    def _flush(self, cmd: _Command) -> _Command | None:
        """Turn the follow-ups not yet written into this internal command's events."""
        c = Collected(self.entity)
        for f in bookkeeping(self.entity).take_follow_ups():
            c.marks[len(c.events)] = {ON_EVENT_KEY: f.trigger}
            c.events.append(f.event)
            c.destinations.append(f.destinations)
            c.callbacks.append(None)
        cmd.collected = c
        if not c.events:
            self._reply(cmd)
            return None
        return cmd

    def _enqueue_follow_ups(self) -> None:
        """Follow-ups are written next, before any waiting command."""
        if not bookkeeping(self.entity).has_follow_ups_to_write:
            return
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.appendleft(_Command(_FLUSH, fut))
        self._wake.set()

    def _after_flush(self, error: BaseException | None) -> None:
        """Right where the follow-ups' write ended, before the loop takes another command: a
        failure restarts the entity first (a done-callback would run only after the next
        command had been handled, on state that lacks the follow-ups)."""
        if error is None:
            return
        # Eventuate restarts the actor: recovery finds the follow-ups still missing and retries
        log.warning("follow-up write of %s failed (%s): restarting before the next command", self.persistence_id, error)
        bookkeeping(self.entity).release()
        self._needs_restart = True
        self._wake.set()

    def _unstash(self) -> list[_Command]:
        """Stashed commands go to the front of the queue, in stash order."""
        stashed = self._take_stash()
        self._queue.extendleft(reversed(stashed))
        self._wake.set()  # also from a write that completed in the background
        return stashed

    def _take_stash(self) -> list[_Command]:
        for timer in self._stash_timers.values():
            timer.cancel()
        self._stash_timers.clear()
        stashed = list(self._stash)
        self._stash.clear()
        return stashed

    def _reply(self, cmd: _Command, written: EventEnvelope | None = None) -> None:
        """``written``: the command's last event (its write's vector time is the timed reply's)."""
        if cmd.future.done():
            return
        try:
            value = cmd.reply.fn() if isinstance(cmd.reply, AfterPersist) else cmd.reply
        except Exception as e:
            cmd.future.set_exception(e)
            return
        if not cmd.timed:
            cmd.future.set_result(value)
            return
        as_of = cmd.collected.as_of if cmd.collected is not None else None
        seq_nr = written.seq_nr if written is not None else as_of if as_of is not None else self.entity.sequence_nr
        cmd.future.set_result(TimedReply(value, VectorTime({self.persistence_id: seq_nr})))

    # -- writes -----------------------------------------------------------------------------

    def _kick_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write_pending())

    async def _write_pending(self) -> None:
        while self._pending and not self._needs_restart:
            batch = self._pending[: self._settings.max_batch_commands]
            del self._pending[: len(batch)]
            await self._write(batch)

    async def _drain_writer(self) -> None:
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)
            if self._pending and not self._needs_restart:
                self._kick_writer()

    async def _write(self, batch: list[_Command]) -> None:
        events: list[Any] = []
        dests: list[tuple[str, ...]] = []
        event_marks: dict[int, dict[str, Any]] = {}
        routed: dict[int, tuple[str, int]] = {}
        for cmd in batch:
            assert cmd.collected is not None
            event_marks.update({len(events) + i: m for i, m in cmd.collected.marks.items()})
            routed.update({len(events) + i: src for i, src in cmd.collected.routed.items()})
            events.extend(cmd.collected.events)
            dests.extend(cmd.collected.destinations)
        expected = self.entity.sequence_nr
        # also what _resolve re-checks
        metadata = with_marks(routes_metadata(expected + 1, dests, routed), expected + 1, event_marks)
        book = bookkeeping(self.entity)
        confirming = {str(m[CONFIRMS_KEY]) for m in event_marks.values() if CONFIRMS_KEY in m}
        book.confirming |= confirming  # no redelivery while the confirmation may be stored
        try:
            await self._write_events(batch, events, expected, metadata)
        finally:
            book.confirming -= confirming
        for cmd in batch:
            if cmd.command is _FLUSH and cmd.future.done() and not cmd.future.cancelled():
                self._after_flush(cmd.future.exception())

    async def _write_events(self, batch: list[_Command], events: list[Any], expected: int, metadata: Any) -> None:
        try:
            self._breaker.check()
        except JournalUnavailable as e:
            self._write_failed(batch, e)
            return
        try:
            envs = await self._journal.persist(
                self.persistence_id,
                events,
                expected_seq_nr=expected,
                tags=self.entity.tags,
                metadata=metadata,
            )
            self._breaker.record_success()
        except SequenceConflict as e:
            self._breaker.record_success()
            self._conflict(batch, e)
            return
        except JournalUnavailable as e:
            self._breaker.record_failure()
            if not e.outcome_unknown:  # known not written: report at once
                self._write_failed(batch, e)
                return
            log.warning("write of %s interrupted (%s): resolving its outcome", self.persistence_id, e)
            try:
                envs = await self._resolve(expected, events, metadata)
            except SequenceConflict as c:
                self._conflict(batch, c)
                return
            except JournalError as n:
                self._write_failed(batch, n)
                return
        except Exception as e:  # serialization or bad input: nothing was written
            self._write_failed(batch, e)
            return
        self._applied(batch, envs)

    def _applied(self, batch: list[_Command], envs: list[EventEnvelope]) -> None:
        """Written: event handlers, then callbacks, then replies (in command order)."""
        token = outside_command()
        try:
            i = 0
            for cmd in batch:
                assert cmd.collected is not None
                mine = envs[i : i + len(cmd.collected.events)]
                i += len(mine)
                try:
                    for env in mine:
                        apply_event(self.entity, env, replay=False)
                        set_sequence_nr(self.entity, env.seq_nr)
                except Exception as e:
                    # stored but not applicable: the journal is the truth, rebuild from it
                    log.exception("event handler of %s raised on a stored event", self.persistence_id)
                    set_sequence_nr(self.entity, envs[-1].seq_nr)
                    self._needs_restart = True
                    self._fail(batch[batch.index(cmd) :], e)
                    return
                handlers, persisting = begin_command(self.entity, after_write=True)  # the persist handler
                try:
                    for env, cb in zip(mine, cmd.collected.callbacks, strict=True):
                        if cb is not None:
                            try:
                                cb(env)
                            except Exception:
                                log.exception("on_persisted callback of %s raised", self.persistence_id)
                    self._reply(cmd, mine[-1])
                finally:
                    end_command(persisting)
                self._make_changes(handlers)
        finally:
            end_command(token)
        self._enqueue_follow_ups()
        self.deliveries.send_fresh()
        seq = envs[-1].seq_nr
        wants = any(c.collected is not None and c.collected.snapshot for c in batch)
        every = self.snapshot_every
        if wants or (every and seq // every > (seq - len(envs)) // every):
            task = asyncio.get_running_loop().create_task(self._save_snapshot())
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _save_snapshot(self) -> None:
        entity, seq = self.entity, self.entity.sequence_nr
        result = SnapshotResult(self.persistence_id, seq)
        try:
            state = entity.snapshot_state()
            serializers = self._journal.serializers
            _held = await serializers.load_write_keys([self.persistence_id]) if serializers.keyed else ()
            meta = {
                **(bookkeeping(entity).to_metadata(serializers, self.persistence_id) or {}),
                **(snapshot_route_metadata(entity) or {}),
            }
            async with self._snapshot_lock:  # in order: an older one never lands after a newer one
                await self._journal.save_snapshot(
                    self.persistence_id, seq, state, metadata=meta or None,
                    keep=self._settings.snapshots_per_emitter_max,
                )  # fmt: skip
        except Exception as e:
            log.warning("snapshot of %s at %d failed (recovery will replay more events): %s",
                        self.persistence_id, seq, e)  # fmt: skip
            result = SnapshotResult(self.persistence_id, seq, e)
        try:
            entity.on_snapshot_saved(result)
        except Exception:
            log.exception("on_snapshot_saved of %s raised", self.persistence_id)

    async def _resolve(self, expected: int, events: list[Any], metadata: Any) -> list[EventEnvelope]:
        """Learn whether an interrupted write committed (:meth:`Journal.resolve_persist`);
        retry (reads only) until known."""
        pid = self.persistence_id
        delay = self._settings.breaker_reset_timeout / 4
        while True:
            try:
                envs = await self._journal.resolve_persist(
                    pid, events, expected_seq_nr=expected, tags=self.entity.tags, metadata=metadata
                )
            except JournalUnavailable as e:
                if not e.outcome_unknown:
                    self._breaker.record_success()
                    raise
                self._breaker.record_failure()
                log.warning("outcome of the write of %s still unknown (%s)", pid, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._settings.resolve_max_backoff)
                continue
            except SequenceConflict:
                self._breaker.record_success()
                raise
            self._breaker.record_success()
            return envs

    def _conflict(self, batch: list[_Command], e: SequenceConflict) -> None:
        """Our view of the pid is stale: fail these and every handled-unwritten command, restart."""
        self._needs_restart = True
        stale = batch + self._pending
        self._pending = []
        self._fail(stale, e)
        self._wake.set()

    def _write_failed(self, batch: list[_Command], e: BaseException) -> None:
        """Known not written: undo what the commands changed besides events, fail them."""
        self._undo(batch)
        self._fail(batch, e)

    @staticmethod
    def _fail(batch: list[_Command], e: BaseException) -> None:
        for cmd in batch:
            if not cmd.future.done():
                cmd.future.set_exception(e)
