"""orjson.dumps of 1000 small events, client CPU, while 1000 earlier payloads stay alive: run it
with and without ``MALLOC_TRIM_THRESHOLD_=268435456`` (glibc then keeps the heap's top instead
of giving it back and faulting it in again on the next call)."""

import time

import orjson

from benchmarks.write_throughput import payload

events = [payload(3) for e in range(1000)]
kept = list(map(orjson.dumps, events))
t = time.process_time()
for _ in range(2000):
    list(map(orjson.dumps, events))
print(f"{(time.process_time() - t) / 2000 * 1e3:.3f} ms per 1000 dumps")
