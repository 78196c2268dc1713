"""slice-journal projections."""
