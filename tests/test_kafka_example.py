"""examples/kafka_orders.py, run as a user would against the session's broker and database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from journal import Journal

pytestmark = pytest.mark.kafka
ROOT = Path(__file__).resolve().parents[1]


def test_the_orders_arrive_in_the_topic(journal: Journal, dsn: str, kafka_bootstrap: str) -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "kafka_orders.py")],
        env={**os.environ, "JOURNAL_DSN": dsn, "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap},
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = sorted(out.stdout.splitlines())
    assert lines == sorted(
        f"b'order|{o}' #b'{n}' b'{{\"{what}\":\"{o}\"}}'"
        for o in ("o1", "o2", "o3")
        for n, what in ((1, "placed"), (2, "paid"))
    )
