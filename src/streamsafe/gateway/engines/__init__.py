"""The engines behind the gateway: the pool (which engine), failover (what after a failed attempt),
and a generation's attempts."""
