"""Shared pieces for the client tests: the fake servers live in ``client_fakes``."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
