"""Query algorithms over the backend seam: slice queries, the horizon, live notifications."""
