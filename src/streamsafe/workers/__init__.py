"""``streamsafe serve --workers N``: N gateway processes on one port, supervised by the process
that was started (see docs/gateway.md, Workers)."""
