"""streamsafe_bench."""
