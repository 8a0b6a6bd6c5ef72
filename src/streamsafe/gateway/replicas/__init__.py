"""Replicas: generations shared through Redis, mirrored and taken over by the other gateway
processes."""
