"""``journal demo``'s closing figures say what they measured: whether the projection kept pace is
computed (it was printed whatever happened), and the latency is split at the kill."""

from __future__ import annotations

from projections.demo.report import latency_rows, pace


def test_kept_pace_is_computed_from_the_backlog() -> None:
    assert pace(backlog=40, rate=1000, catch_up=0.2).startswith("kept pace with the writes (40 events behind")
    behind = pace(backlog=5000, rate=1000, catch_up=6.5)
    assert behind.startswith("fell behind the writes (5000 events, 5.0s of writes") and "caught up 6.5s later" in behind


def test_latency_is_reported_in_steady_state_and_across_the_kill() -> None:
    rows = [
        {"steady": False, "p50": 0.4, "p99": 2.6, "mx": 2.9},
        {"steady": True, "p50": 0.05, "p99": 0.2, "mx": 0.3},
    ]
    (steady, label_s), (kill, label_k) = latency_rows(rows)
    assert steady == "latency, steady state" and label_s.startswith("p50 50 ms, p99 200 ms")
    assert "before the kill" in label_s
    assert kill == "latency, across the kill" and "p99 2600 ms" in label_k and "lease expiry and takeover" in label_k
