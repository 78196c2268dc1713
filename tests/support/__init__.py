"""Test support shared by the tests and the benchmarks (not part of the shipped library)."""
