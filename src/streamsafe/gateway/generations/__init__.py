"""Generations and their logs: one upstream request, its events, its subscribers' fan-out, and what
is kept after it ends."""
