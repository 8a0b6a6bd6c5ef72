"""What every benchmark does with its report: write it as JSON where asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_json"]


def write_json(path: str | None, report: Any) -> None:
    """Write ``report`` to ``path`` as indented JSON (creating folders); nothing if no path."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2))
