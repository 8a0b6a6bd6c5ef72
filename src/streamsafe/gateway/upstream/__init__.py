"""One engine's connection: its kind, the hot stream reader, its breaker and health."""
