"""streamsafe.bench."""
