"""streamsafe.client."""
