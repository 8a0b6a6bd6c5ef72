"""Shared pieces for the SDK transport tests: the gateway's and the client's helpers."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, "..", "gateway"))
sys.path.insert(0, os.path.join(HERE, "..", "client"))
