"""A journal over two databases, one of them behind a relay that loses its answers: the write
cut mid-statement is resolved from the rows on its own, never holding up the calls of the other
database that shared its batch."""

from __future__ import annotations

import asyncio
import time

from test_partition_dead_moves import pids_of
from test_partitions import partitioned, stored

from tests.support.relay import relay_to

SLOW_RESOLUTION = dict(attempts=12, initial_backoff=0.2, max_backoff=1.0, connect_timeout=1.0)
"""While the relay loses answers, resolving the cut write retries for several seconds."""


async def test_a_batch_holding_an_interrupted_write_answers_the_other_databases_calls_at_once(
    parts: list[str],
) -> None:
    """Database 1's answers are lost (its commit goes on): a write of one of its pids and fifty
    of database 0's, sent together: the fifty are answered at once, while the cut write waits
    for its resolution; once answers come back, it is found written (seq_nr 2)."""
    cut = pids_of("Lost", 512, 1023, 1)[0]
    others = pids_of("Lost", 0, 511, 51)
    async with relay_to(parts[1]) as relay:
        dbs = [parts[0], relay.dsn_through(parts[1])]
        async with partitioned(dbs, eventual_consistency_delay=0.0, **SLOW_RESOLUTION) as j:
            await j.persist(cut, [{"n": 1}])
            relay.losing = True
            try:
                first = asyncio.ensure_future(j.persist(others[0], [{"n": 1}]))  # the idle path; the rest queue
                held = asyncio.ensure_future(j.persist(cut, [{"n": 2}], expected_seq_nr=1))
                rest = [asyncio.ensure_future(j.persist(p, [{"n": 1}])) for p in others[1:]]
                started = time.monotonic()
                await asyncio.wait_for(asyncio.gather(first, *rest), 3.0)
                answered = time.monotonic() - started
                assert relay.lost_answers > 0
                assert not held.done()
            finally:
                relay.losing = False
            (env,) = await asyncio.wait_for(held, 30)
            assert env.seq_nr == 2
            assert answered < 3.0
    rows = await stored(parts[1], "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", cut)
    assert sorted(r[0] for r in rows) == [1, 2]
    for p in others:
        rows = await stored(parts[0], "SELECT seq_nr FROM event_journal WHERE persistence_id = $1", p)
        assert [r[0] for r in rows] == [1]
