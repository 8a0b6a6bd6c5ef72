"""Serving the caller: reading a request, writing a generation to a subscriber, and the routes
passed through."""
