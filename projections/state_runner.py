"""State projections: the changes of durable state by slices on the projection workers (issue 34).

A :class:`StateProcessor` is a slice range's processor (:class:`~projections.runner.RangeProcessor`)
over another query: ``DurableState.change_envelopes``, the live changes of the entity type's
states in the journal's query mode, with heartbeats. Everything around it is the event
projections' own: the batches, the deliveries (exactly-once, grouped, at-least-once), the
isolation of poisoned changes (skip, dead letter), the transaction runner, the leases, and the
offset rows, in the same table (``projection_timestamp_offset_store``, the revision in the
``seq_nr`` column).

Admission is by revision (:class:`StateValidator`): a change is new when its revision is above
the one stored for its pid. Revisions may be skipped (a state is one row, read at its latest
revision), so a higher revision is never a gap and nothing is replayed. The handler gets each
change as an :class:`~journal.UpdatedState` or :class:`~journal.DeletedState`
(:func:`state_handler`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from journal import Journal
from journal.durable_state import DurableState, state_change
from journal.envelope import EventEnvelope
from journal.errors import ConfigurationError
from journal.offsets import TimestampOffset
from journal.settings import JournalSettings

from .batches import Reader, one_a_page
from .handlers import Mode, check_handler, validate_mode
from .parts import ProjectionParts
from .recovery import HandlerRecovery
from .runner import RangeProcessor
from .validation import Check, Validator, Verdict
from .worker import Worker

_ACCEPT = Check(Verdict.ACCEPT)
_DUPLICATE = Check(Verdict.DUPLICATE)
_UNKNOWN = Check(Verdict.UNKNOWN)


class StateValidator(Validator):
    """A slice range's stored offsets, checked by revision: a change whose revision is above the
    pid's stored one is new, whatever revisions it skipped (never a GAP)."""

    def check(self, env: EventEnvelope, *, per_pid: bool = False) -> Check:
        """A pid in memory: by its revision. Else, in horizon mode, the slice offset decides (a
        pid's revisions are stamped in increasing order, so a delivered later revision would
        cover this one). In backtracking mode (a change may commit below the slice offset), a
        change within the window behind the slice's latest offset is new (a delivered revision of
        its pid would be in memory); an older one is UNKNOWN: the store is asked."""
        pid, revision, slice_ = env.persistence_id, env.seq_nr, env.slice
        known = self.known_seq_nr(slice_, pid)
        if known is not None:
            return _DUPLICATE if revision <= known else _ACCEPT
        if per_pid:
            start = self.window_start(slice_)
            return _ACCEPT if start is None or env.db_timestamp >= start else _UNKNOWN
        return _DUPLICATE if self.covered_by_slice(slice_, env.db_timestamp, pid, revision) else _ACCEPT


class StateProcessor(RangeProcessor):
    """Processes the state changes of slices ``lo..hi`` while it holds their leases."""

    def __init__(self, parts: ProjectionParts, **range_: Any) -> None:
        super().__init__(parts, **range_)
        self.states: DurableState = parts.journal.durable_state()

    def _validator(self, window: timedelta) -> Validator:
        return StateValidator(window)

    def _query(self, offset: TimestampOffset | None) -> Reader:
        et, lo, hi, mode = self.entity_type, self.lo, self.hi, self.query_mode
        return one_a_page(lambda: self.states.change_envelopes(et, lo, hi, offset, mode))

    async def _validate_into(self, env: EventEnvelope, accepted: list[EventEnvelope]) -> None:
        """A change the validator could not place (backtracking mode, older than the window):
        the pid's stored revision decides; none stored: new."""
        v = self.validator
        stored = await self._stored(env)
        if stored is not None:
            v.learn(env.slice, env.persistence_id, *stored)
            if v.check(env, per_pid=True).verdict is Verdict.DUPLICATE:
                self.stats.duplicates += 1
                return
        accepted.append(env)
        v.record(env)


def state_handler(handler: Callable[..., Awaitable[None]], mode: Mode) -> Callable[..., Awaitable[None]]:
    """``handler`` (of ``mode``'s kind) called with the changes (:class:`~journal.UpdatedState`,
    :class:`~journal.DeletedState`) of the envelopes the deliveries hand on."""
    if mode == "exactly-once":

        async def one(conn: Any, env: EventEnvelope) -> None:
            await handler(conn, state_change(env))

        return one
    if mode == "grouped":

        async def group(conn: Any, envs: Sequence[EventEnvelope]) -> None:
            await handler(conn, [state_change(e) for e in envs])

        return group

    async def alone(env: EventEnvelope) -> None:
        await handler(state_change(env))

    return alone


def refuse_sequenced(recovery: HandlerRecovery) -> None:
    """A state projection takes every failure strategy but the sequenced one (ConfigurationError)."""
    if recovery.sequenced:
        raise ConfigurationError(
            "retry-and-dead-letter-sequenced is for events: a state projection sees each id's latest "
            "revision only, so there is nothing to hold in order behind a dead letter (use retry-and-dead-letter)"
        )


class StateWorker(Worker):
    """A :class:`Worker` over the changes of an entity type's durable states instead of its events:
    the handler gets :class:`~journal.UpdatedState` and :class:`~journal.DeletedState` (the latest
    revision of every changed pid; intermediate revisions may be skipped), with the same modes,
    failure strategies, leases, offsets and metrics (docs/durable-state.md, "State projections")."""

    lag_counts_states = True
    """The lag sampler counts the states changed after each slice's offset (``projection_lag_events``
    and ``projection_lag_seconds``, the event projections' names and labels)."""

    def __init__(
        self, journal: Journal, settings: JournalSettings, name: str, entity_type: str,
        handler: Callable[..., Awaitable[None]], mode: str = "grouped", *, worker_id: str | None = None,
        recovery: str | HandlerRecovery | None = None,
    ) -> None:  # fmt: skip
        m = validate_mode(mode)
        wrapped = state_handler(check_handler(handler, m), m)
        refuse_sequenced(HandlerRecovery.parse(recovery, settings.projection))
        super().__init__(journal, settings, name, entity_type, wrapped, m, worker_id=worker_id, recovery=recovery)

    def _processor(self, lo: int, hi: int) -> StateProcessor:
        return StateProcessor(
            self._parts(), entity_type=self.entity_type, lo=lo, hi=hi,
            epochs={s: self.epochs[s] for s in range(lo, hi + 1)}, query_mode=self._query_mode(),
        )  # fmt: skip
