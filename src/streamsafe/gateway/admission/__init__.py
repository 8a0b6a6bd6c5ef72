"""Admission: which generation enters the engine, and when (sans-I/O core and its shell)."""
