"""Events by tag: time buckets, TimeUUIDs, the tag writer and the events-by-tag query."""
