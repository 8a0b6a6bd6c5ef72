"""streamsafe.gateway: one generation per logical request, resumable streams, admission.

>>> from streamsafe.gateway import Gateway, GatewayConfig
>>> app = Gateway(GatewayConfig(upstream="http://127.0.0.1:8000"))  # an ASGI app
"""

from __future__ import annotations

from streamsafe.gateway.admission.admission import Admission, Shed, request_cost
from streamsafe.gateway.admission.fair_queue import AdmissionCore
from streamsafe.gateway.app import Gateway
from streamsafe.gateway.config import CommitMode, GatewayConfig
from streamsafe.gateway.generations.store import EventLog, MemoryEventLog, MemoryStore, Store

__all__ = [
    "Admission",
    "AdmissionCore",
    "CommitMode",
    "EventLog",
    "Gateway",
    "GatewayConfig",
    "MemoryEventLog",
    "MemoryStore",
    "Shed",
    "Store",
    "request_cost",
]
