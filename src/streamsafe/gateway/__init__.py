"""streamsafe.gateway."""
