"""The relay: one task per generation that runs its attempts and writes what the engine sends into
its log."""
