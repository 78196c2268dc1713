"""old vs new lone statement, one pid each, alternating call by call; wall and backend CPU per call.

    PYTHONPATH=. python benchmarks/profiles/lone_ab.py CALLS [OLD.json]

OLD.json: the old statement's text (default old_lone.json, main's before 11-27's first change;
lone_6c2d995.json: main's at 6c2d995, with a CTE and a UNION ALL branch for the conflict)."""

import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import asyncpg
import orjson

from benchmarks._common import fresh_database
from benchmarks.write_throughput import RAW_SINGLE, payload
from journal import runtime, slice_for
from journal.postgres.statements import Statements
from journal.postgres.write_statements import WriteStatements
from journal.serialization import SerializerRegistry
from journal.write_validation import WriteValidator


def cpu(path):
    with open(path) as f:
        return int(f.read().split()[0])


async def main(dsn, calls):
    conn = await asyncpg.connect(dsn)
    w = str(uuid.uuid4())
    sql = WriteStatements(Statements("public"), notify=True, bucket_millis=1)
    v = WriteValidator(SerializerRegistry())
    old = json.loads((Path(__file__).parent / (sys.argv[2] if len(sys.argv) > 2 else "old_lone.json")).read_text())
    new = sql._lone[True]
    i = new.index("FROM (SELECT CASE")
    j = new.index(") k LEFT JOIN")
    no_owner = new[:i] + "FROM (SELECT clock_timestamp() AS t, $12::bigint AS e" + new[j:]
    i = new.index("LEFT JOIN LATERAL (SELECT e.seq_nr")
    j = new.index(") p ON true")
    no_probe = new[:i] + "LEFT JOIN LATERAL (SELECT $4::bigint AS seq_nr, NULL::timestamptz AS db_timestamp" + new[j:]
    no_notify = WriteStatements(Statements("public"), notify=False, bucket_millis=1)._lone[True]
    variants = {
        "bare": RAW_SINGLE,
        "old": old["known"],
        "new": new,
        "no_owner": no_owner,
        "no_probe": no_probe,
        "no_notify": no_notify,
    }
    prep = {k: await conn.prepare(t) for k, t in variants.items()}
    path = f"/proc/{conn.get_server_pid()}/schedstat"
    wall = {k: [] for k in variants}
    srv = {k: [] for k in variants}
    names = list(variants)
    pay = payload(3)
    for n in range(calls):
        for i in range(len(names)):
            k = names[(n + i) % len(names)]
            pid = f"{k}|1"
            args = (
                (slice_for(pid), pid, n + 1, orjson.dumps(pay), w)
                if k == "bare"
                else sql.statement(v.batch([(pid, [pay], n)]), w, 0)[1]
            )
            c0 = cpu(path)
            t0 = time.perf_counter()
            r = await prep[k].fetch(*args)
            t1 = time.perf_counter()
            c1 = cpu(path)
            if k not in ("bare", "old"):
                assert len(r) == 1 and r[0]["bad"] == 0, r
            if n >= 50:
                wall[k].append(t1 - t0)
                srv[k].append((c1 - c0) / 1e3)
    # a conflict on the new statement
    r = await prep["new"].fetch(*sql.statement(v.batch([("new|1", [pay], 0)]), w, 0)[1])
    print("conflict: no row" if not r else f"conflict row: {dict(r[0])}")
    for k in names:
        print(
            f"{k:5} wall {1e6 * statistics.median(wall[k]):6.1f} us  server CPU {statistics.median(srv[k]):6.1f} us (mean {statistics.mean(srv[k]):6.1f})"
        )
    await conn.close()


with fresh_database() as dsn:
    runtime.run(main(dsn, int(sys.argv[1])))
