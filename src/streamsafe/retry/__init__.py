"""streamsafe.retry."""
