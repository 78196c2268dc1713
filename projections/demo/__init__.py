"""``journal demo``: shopping carts written, projected by worker processes that are killed,
restarted and rescaled, and verified against a journal replay.

The command lives in projections (it runs projection workers); the ``journal`` command line picks
it up through the ``slice_journal.cli`` entry-point group declared in pyproject.toml, so the
``journal`` package never imports ``projections``.
"""
