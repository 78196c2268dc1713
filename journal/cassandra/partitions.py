"""Where a persistence id's events live in ``messages``: the (persistence_id, partition_nr) math.

The reference numbers partitions ``(seq_nr - 1) // target_partition_size`` and keeps each atomic
write in ONE partition, so an event is not always in "its" partition: the reference writes a call
into the partition of its LAST event, and its readers look for ``seq_nr`` n in partition
``partition_nr(n)`` or the one after it (one empty partition tolerated). Partition of the first
event (this project's first version) broke that: a replay from just past a boundary started one
partition too late and skipped the earlier write's tail.

This layout writes every call into ``partition_nr(first) + 1``. It stays inside the reference's
reading rule (a call holds at most ``target_partition_size`` events, so every event n of it has
``partition_nr(n)`` equal to that partition or the one before), and it depends on the first
sequence number alone: two writers racing for the same numbers always meet in the same partition,
where a lightweight transaction can tell them apart (see :mod:`journal.cassandra.writes`).
Partition 0 stays empty; readers skip one empty partition, as the reference's do.
"""

from __future__ import annotations

from ..errors import InvalidArgument


class PartitionLayout:
    """The pure partition rules for one ``target_partition_size``."""

    __slots__ = ("size",)

    def __init__(self, target_partition_size: int) -> None:
        if target_partition_size < 1:
            raise InvalidArgument(f"target_partition_size must be >= 1, got {target_partition_size}")
        self.size = target_partition_size

    def partition_nr(self, seq_nr: int) -> int:
        """``(seq_nr - 1) // size`` (sequence numbers start at 1)."""
        if seq_nr < 1:
            raise InvalidArgument(f"seq_nr must be >= 1, got {seq_nr}")
        return (seq_nr - 1) // self.size

    def check_call(self, persistence_id: str, events: int) -> None:
        """A call of more than ``size`` events could span three partitions: refused (no I/O)."""
        if events > self.size:
            raise InvalidArgument(
                f"persist({persistence_id!r}) with {events} events: a call holds at most "
                f"target_partition_size={self.size} events on Cassandra"
            )

    def write_partition(self, first_seq_nr: int) -> int:
        """The one partition that receives a call whose first event is ``first_seq_nr``."""
        return self.partition_nr(first_seq_nr) + 1

    def first_partition(self, from_seq_nr: int) -> int:
        """Where a read of numbers from ``from_seq_nr`` on starts."""
        return self.partition_nr(max(from_seq_nr, 1))

    def may_hold(self, partition: int, next_seq_nr: int) -> bool:
        """Can ``partition`` (or a later one) still hold ``next_seq_nr``, given that every partition
        before ``partition`` was read? A number n lives in ``partition_nr(n)`` or the next one."""
        return partition <= self.partition_nr(max(next_seq_nr, 1)) + 1

    def delete_partitions(self, from_seq_nr: int, to_seq_nr: int) -> range:
        """Every partition that may hold a number in ``[from, to]``."""
        return range(self.first_partition(from_seq_nr), self.partition_nr(max(to_seq_nr, 1)) + 2)


class PartitionCursor:
    """Reads of one pid, partition after partition: ask :attr:`partition` for numbers from
    :attr:`next_seq_nr` on, report what came back with :meth:`advance`, stop when :meth:`more`
    says no. Drives replay and the highest-number scan alike."""

    __slots__ = ("layout", "next_seq_nr", "partition")

    def __init__(self, layout: PartitionLayout, from_seq_nr: int) -> None:
        self.layout = layout
        self.next_seq_nr = max(from_seq_nr, 1)
        self.partition = layout.first_partition(self.next_seq_nr)

    def more(self) -> bool:
        return self.layout.may_hold(self.partition, self.next_seq_nr)

    def advance(self, last_seq_nr: int | None) -> None:
        """The current partition is read to its end; ``last_seq_nr`` is the highest number it gave
        (None: none at or above :attr:`next_seq_nr`)."""
        if last_seq_nr is not None:
            self.next_seq_nr = max(self.next_seq_nr, last_seq_nr + 1)
        self.partition += 1
