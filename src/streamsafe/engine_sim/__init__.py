"""streamsafe.engine_sim."""
