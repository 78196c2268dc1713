"""The slice query that starts from snapshots, on a real PostgreSQL (issue 36, item 2).

The read model of every test is a pid's running sum: an event adds its ``n``; a snapshot holds
the sum as of its seq_nr. A full read and a read from snapshots must give equal models, and
every offset the query gives must be safe to resume from (never ahead of an event not yet
delivered: r2dbc #717), including the bad input of the issue.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import asyncpg
import pytest
from slice_helpers import collect

from journal import (
    EventEnvelope,
    Forgotten,
    InvalidArgument,
    Journal,
    JournalSettings,
    OffsetError,
    SequenceOffset,
    SerializationError,
    TimestampOffset,
    open_journal,
    slice_for,
)
from projections import Worker
from tests.support.waiting import wait_until

ET = "acct"


@pytest.fixture
async def small(journal: Journal, dsn: str) -> AsyncIterator[Journal]:
    """A journal (over the emptied tables) with small pages, so every test crosses pages."""
    s = JournalSettings.load(env={}, dsn=dsn, buffer_size=7, catch_up_buffer_size=11, refresh_interval=0.2)
    async with open_journal(dsn, settings=s) as j:
        yield j


def fold(envs: Iterable[EventEnvelope], model: dict[str, int] | None = None) -> dict[str, int]:
    """The read model: a snapshot sets the pid's sum, an event adds to it."""
    model = {} if model is None else model
    for e in envs:
        if e.source == "snapshot":
            model[e.persistence_id] = e.event["sum"]
        else:
            model[e.persistence_id] = model.get(e.persistence_id, 0) + e.event["n"]
    return model


def judged(envs: Iterable[EventEnvelope]) -> list[EventEnvelope]:
    """``envs`` as a consumer judging each pid by its sequence numbers takes them: an envelope at
    or below its pid's last seq_nr (an event a snapshot it got covers) is a duplicate."""
    last: dict[str, int] = {}
    out = []
    for e in envs:
        if e.source == "snapshot" or e.seq_nr > last.get(e.persistence_id, 0):
            out.append(e)
            last[e.persistence_id] = e.seq_nr
    return out


async def write(j: Journal, pid: str, first: int, count: int, snapshot_every: int = 0) -> None:
    """``count`` events of ``pid`` numbered from ``first`` (``n`` = seq_nr), one persist each,
    with a snapshot (the sum) every ``snapshot_every`` events."""
    for seq in range(first, first + count):
        await j.persist(pid, [{"n": seq}], expected_seq_nr=seq - 1)
        if snapshot_every and seq % snapshot_every == 0:
            await j.save_snapshot(pid, seq, {"sum": seq * (seq + 1) // 2})


async def test_equal_models_from_snapshots_and_the_bad_input_of_the_issue(small: Journal) -> None:
    j = small
    plain = [f"{ET}|plain{i}" for i in range(4)]
    snapped = [f"{ET}|snap{i}" for i in range(6)]
    await asyncio.gather(*(write(j, p, 1, 9) for p in plain), *(write(j, p, 1, 23, snapshot_every=5) for p in snapped))
    # a snapshot newer than the events it names (seq_nr beyond the pid's last event): not used
    await write(j, f"{ET}|ahead", 1, 6)
    await j.save_snapshot(f"{ET}|ahead", 40, {"sum": -1000})
    # a deleted snapshot: all events again
    await write(j, f"{ET}|deleted", 1, 12, snapshot_every=5)
    await j.delete_snapshot(f"{ET}|deleted")
    # an id with only a snapshot (its events gone, or never written here)
    await j.save_snapshot(f"{ET}|only", 30, {"sum": 465})
    # events deleted up to the snapshot, then more events: the snapshot comes before them
    await write(j, f"{ET}|trimmed", 1, 10, snapshot_every=10)
    await j.delete_events_to(f"{ET}|trimmed", 10)
    await write(j, f"{ET}|trimmed", 11, 3)

    full = fold(await collect(j.current_events_by_slices(ET, 0, 1023)))
    envs = await collect(j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023))
    got = fold(envs)
    # the full read lacks what was deleted and what only a snapshot holds; everything else equal
    assert got.pop(f"{ET}|only") == 465 and got.pop(f"{ET}|trimmed") == sum(range(1, 14))
    assert full.pop(f"{ET}|trimmed") == 11 + 12 + 13
    assert got == full
    assert got[f"{ET}|ahead"] == sum(range(1, 7)) and got[f"{ET}|deleted"] == sum(range(1, 13))

    snaps = [(e.persistence_id, e.seq_nr) for e in envs if e.source == "snapshot"]
    assert sorted(snaps) == sorted([(p, 20) for p in snapped] + [(f"{ET}|only", 30), (f"{ET}|trimmed", 10)])
    events = [(e.persistence_id, e.seq_nr) for e in envs if e.source != "snapshot"]
    assert sorted(events) == sorted(
        [(p, s) for p in plain for s in range(1, 10)] + [(p, s) for p in snapped for s in range(21, 24)]
        + [(f"{ET}|ahead", s) for s in range(1, 7)] + [(f"{ET}|deleted", s) for s in range(1, 13)]
        + [(f"{ET}|trimmed", s) for s in range(11, 14)]
    )  # fmt: skip
    # offsets in stream order: each is where the stream is, so none is ahead of a later envelope
    stamps = [e.offset.timestamp for e in envs if isinstance(e.offset, TimestampOffset)]
    assert len(stamps) == len(envs) and stamps == sorted(stamps)
    # a snapshot stands at the place of the first event it covers (from the start: its pid's
    # first), before any event it leaves out, with an offset naming the snapshot's seq_nr
    first: dict[str, EventEnvelope] = {}
    for e in await collect(j.current_events_by_slices(ET, 0, 1023)):
        first.setdefault(e.persistence_id, e)
    placed = [e for e in envs if e.source == "snapshot" and e.persistence_id in snapped]
    assert len(placed) == len(snapped)
    for e in placed:
        assert e.db_timestamp == first[e.persistence_id].db_timestamp and e.offset.seen == {e.persistence_id: 20}


async def test_resuming_from_any_offset_gives_the_same_model(small: Journal) -> None:
    """Stop after any envelope, resume from its offset from snapshots again: the model is the
    full read's; no event is skipped. Once the catch-up is over, its last offset resumes a plain
    slice query as well (a catch-up's offset mid-way needs the snapshots still to come)."""
    j = small
    pids = [f"{ET}|r{i}" for i in range(5)]
    await asyncio.gather(*(write(j, p, 1, 14, snapshot_every=4) for p in pids))
    await write(j, f"{ET}|ahead", 1, 3)
    await j.save_snapshot(f"{ET}|ahead", 9, {"sum": -1})
    full = fold(await collect(j.current_events_by_slices(ET, 0, 1023)))
    envs = await collect(j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023))
    for i in range(len(envs)):
        head = fold(envs[: i + 1])
        offset = envs[i].offset
        assert isinstance(offset, TimestampOffset)
        again = fold(await collect(j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023, offset)), dict(head))
        assert again == full, i
    await write(j, pids[0], 15, 3)
    last = envs[-1].offset
    assert isinstance(last, TimestampOffset)
    more = fold(await collect(j.current_events_by_slices(ET, 0, 1023, last)), fold(envs))
    assert more == fold(await collect(j.current_events_by_slices(ET, 0, 1023)))


async def test_a_snapshot_saved_during_the_catch_up_is_not_used_by_it(small: Journal) -> None:
    """Snapshots saved while the catch-up is under way (after some of their pids' events came,
    or before any did, or replacing one at 4 that came or did not) are not used by it (a page
    that sees one may lie past the place the snapshot would have had): their pids' events come
    (those after a snapshot that came: 5..); the model is the full read's."""
    j = small
    pids = [f"{ET}|m{i}" for i in range(6)]
    for p in pids:  # one after the other: each pid's events lie after the previous pid's
        await write(j, p, 1, 12, snapshot_every=0)
    for p in pids[1:3]:
        await j.save_snapshot(p, 4, {"sum": 10})
    it = j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023)
    got = [await it.__anext__() for _ in range(15)]  # m0's events, m1's snapshot 4 and events 5, 6
    assert {e.persistence_id for e in got} == {pids[0], pids[1]}
    for p in pids[1:]:
        await j.save_snapshot(p, 10, {"sum": 55})
    got += [e async for e in it]
    assert fold(judged(got)) == fold(await collect(j.current_events_by_slices(ET, 0, 1023)))
    # m1's snapshot 4 came before the replacement, then its later events; m2's came on a page
    # read ahead, or not: its events from 2 or from 1 (2-4 duplicates after the snapshot)
    assert [(e.source, e.seq_nr) for e in got if e.persistence_id == pids[1]] == [("snapshot", 4)] + [
        ("query", s) for s in range(5, 13)
    ]
    assert [(e.source, e.seq_nr) for e in got if e.persistence_id == pids[2]] in (
        [("query", s) for s in range(1, 13)],
        [("snapshot", 4)] + [("query", s) for s in range(2, 13)],
    )
    late = [(e.source, e.seq_nr) for e in got if e.persistence_id == pids[4]]
    assert late == [("query", s) for s in range(1, 13)]
    again = await collect(j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023))  # a new catch-up: used
    assert [(e.source, e.seq_nr) for e in again if e.persistence_id == pids[4]] == [
        ("snapshot", 10),
        ("query", 11),
        ("query", 12),
    ]


async def test_a_snapshot_being_saved_when_the_catch_up_starts_is_not_used(small: Journal, dsn: str) -> None:
    """A snapshot whose save began before the catch-up started but commits after its first page:
    its timestamp lies before the start, yet the first page did not see it (its pid's first
    event came as an event). It is not used (the cutoff is the start of that save); else later
    pages would leave out the events it covers behind a place already passed."""
    j = small
    a, b, filler = f"{ET}|a", f"{ET}|b", [f"{ET}|f{i}" for i in range(12)]
    for seq in range(1, 6):  # interleaved: b's first event on the first page, the rest on later ones
        for p in [a, b, *filler]:
            await j.persist(p, [{"n": seq}], expected_seq_nr=seq - 1)
    await j.save_snapshot(a, 5, {"sum": 15})
    saver = await asyncpg.connect(dsn)
    try:
        tx = saver.transaction()
        await tx.start()
        await saver.execute(
            "INSERT INTO snapshot (slice, entity_type, persistence_id, seq_nr, db_timestamp, write_timestamp, ser_id, "
            "ser_manifest, snapshot) SELECT $2, entity_type, $1, seq_nr, clock_timestamp(), write_timestamp, ser_id, "
            "ser_manifest, snapshot FROM snapshot WHERE persistence_id = $3",
            b, slice_for(b), a,
        )  # fmt: skip
        it = j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023)
        got = [await it.__anext__()]  # the first page is read
        await tx.commit()
    finally:
        await saver.close()
    got += [e async for e in it]
    assert fold(got) == fold(await collect(j.current_events_by_slices(ET, 0, 1023)))
    assert [(e.source, e.seq_nr) for e in got if e.persistence_id == a] == [("snapshot", 5)]
    assert [(e.source, e.seq_nr) for e in got if e.persistence_id == b] == [("query", s) for s in range(1, 6)]


async def test_live_after_the_catch_up_delivers_events_not_snapshots(small: Journal) -> None:
    j = small
    pid = f"{ET}|live"
    await write(j, pid, 1, 10, snapshot_every=5)
    it = j.events_by_slices_starting_from_snapshots(ET, 0, 1023)
    first = await it.__anext__()
    assert (first.source, first.seq_nr, first.event) == ("snapshot", 10, {"sum": 55})
    await write(j, pid, 11, 10, snapshot_every=5)  # snapshots at 15 and 20 are written live
    later = [await asyncio.wait_for(it.__anext__(), 30) for _ in range(10)]
    assert [(e.source, e.seq_nr) for e in later] == [("query", s) for s in range(11, 21)]
    await it.aclose()  # type: ignore[attr-defined]


async def test_bad_input_is_refused_at_call_time(small: Journal) -> None:
    with pytest.raises(InvalidArgument):
        small.current_events_by_slices_starting_from_snapshots(ET, 5, 2)
    with pytest.raises(OffsetError):
        small.events_by_slices_starting_from_snapshots(ET, 0, 1023, SequenceOffset(3))  # type: ignore[arg-type]


async def test_the_benchmarks_data_set_small_equal_models_fewer_events(small: Journal, dsn: str) -> None:
    """benchmarks/from_snapshots.py on 20,000 events over 2,000 ids (its 1M run is not a test)."""
    from benchmarks.from_snapshots import fill, read

    events, snapshots = await fill(dsn, 20_000, 2_000, 100)
    assert (events, snapshots) == (20_000, 60)
    full, snap = await read(small, from_snapshots=False), await read(small, from_snapshots=True)
    assert full.model == snap.model and len(full.model or {}) == 2_000
    assert (full.events, full.snapshots, snap.snapshots) == (20_000, 0, 60)
    assert snap.events < full.events / 4


async def test_sealed_snapshots_decode_forgotten_ones_read_as_events_do(journal: Journal, dsn: str) -> None:
    """With the codec: a sealed snapshot decodes; a forgotten subject's snapshot and events come
    as Forgotten values (as its events do in any query). Without it: one typed error naming the
    snapshot."""
    settings = JournalSettings.load(env={}, dsn=dsn, encrypt=True)
    ann, bob = f"{ET}|ann", f"{ET}|bob"
    async with open_journal(dsn, settings=settings) as j:
        for pid in (ann, bob):
            await write(j, pid, 1, 6, snapshot_every=5)
        assert await j.forget(ann)
        envs = await collect(j.current_events_by_slices_starting_from_snapshots(ET, 0, 1023))
        by_pid = {p: [(e.source, e.seq_nr, e.event) for e in envs if e.persistence_id == p] for p in (ann, bob)}
        assert by_pid[bob] == [("snapshot", 5, {"sum": 15}), ("query", 6, {"n": 6})]
        assert [(s, n) for s, n, _ in by_pid[ann]] == [("snapshot", 5), ("query", 6)]
        assert all(isinstance(ev, Forgotten) for _, _, ev in by_pid[ann])
    async with open_journal(dsn, settings=JournalSettings.load(env={}, dsn=dsn)) as plain:
        with pytest.raises(SerializationError, match=r"snapshot of acct\|(ann|bob)#5") as e:
            await collect(plain.current_events_by_slices_starting_from_snapshots(ET, 0, 1023))
        assert len(str(e.value).splitlines()) == 1, e.value


async def test_a_snapshot_replaced_past_the_bound_mid_catch_up_leaves_the_projection_nothing_to_replay(
    small: Journal,
) -> None:
    """After the first page, each pid's snapshot (which left some of its events out) is replaced
    by one whose event lies past the catch-up's bound: the snapshot came before any event it
    left out (at its pid's first event), so nothing is missing; the events it covered that come
    now are duplicates by their sequence numbers (when the snapshot came at the place of the
    event it names: the handler got #8 of a pid it never saw, and the runner had to replay)."""
    j = small
    pids = [f"{ET}|x{i}" for i in range(6)]
    for seq in range(1, 13):  # interleaved in time: every page holds some of each pid
        for p in pids:
            await j.persist(p, [{"n": seq}], expected_seq_nr=seq - 1)
    for p in pids[1:]:
        await j.save_snapshot(p, 10, {"sum": 55})
    pages = j.event_pages_by_slices_starting_from_snapshots
    replaced = asyncio.Event()

    async def replacing(*args: Any, **kwargs: Any) -> AsyncIterator[list[EventEnvelope]]:
        async for page in pages(*args, **kwargs):
            yield page
            if not replaced.is_set():
                replaced.set()
                for p in pids[1:]:
                    await write(j, p, 13, 8, snapshot_every=20)  # snapshot 20: past the bound

    j.event_pages_by_slices_starting_from_snapshots = replacing  # type: ignore[method-assign]
    model: dict[str, list[int]] = {}

    async def handle(conn: Any, envs: Sequence[EventEnvelope]) -> None:
        for e in envs:
            seqs = model.setdefault(e.persistence_id, [])
            assert (seqs[-1] if seqs else 0) + 1 == e.seq_nr, (e.persistence_id, seqs[-1:], e.seq_nr)
            seqs.append(e.seq_nr)

    async def restore(conn: Any, envs: Sequence[EventEnvelope]) -> None:
        for e in envs:
            model[e.persistence_id] = list(range(1, e.seq_nr + 1))

    w = Worker(j, j.settings, f"fsx-{uuid.uuid4().hex[:6]}", ET, handle, "grouped", from_snapshots=True,
               snapshot_handler=restore)  # fmt: skip
    task = asyncio.create_task(w.run())
    try:
        want = {p: list(range(1, 13 if p == pids[0] else 21)) for p in pids}
        await wait_until(lambda: task.done() or model == want, 60, "the projection's model")
        assert not task.done(), task
    finally:
        w.stop()
        await task
    assert replaced.is_set() and w.stats.replayed == 0 and w.stats.duplicates > 0
