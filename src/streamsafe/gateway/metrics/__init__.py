"""The gateway's series, defined once: the counters and readings of ``/stats``, the
histograms, the per-route series, ``/metrics`` and the Grafana dashboard generated from them."""
