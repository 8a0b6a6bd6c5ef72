"""What every benchmark does with its report: the same output flags everywhere, and JSON written
one way.

Every benchmark takes ``--json FILE`` (and ``--plot FILE``, ``--markdown FILE`` where it draws or
tabulates); ``streamsafe bench all --out DIR`` fills them in as ``DIR/bench-NAME.json`` (``.png``,
``.md``), so no benchmark needs a default run of its own.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["OUTPUTS", "add_output_flags", "write_json", "write_text"]

OUTPUTS = {"json": "json", "plot": "png", "markdown": "md"}
"""Output flag -> file extension ``bench all`` gives it."""


def add_output_flags(
    parser: argparse.ArgumentParser, *, plot: bool = False, markdown: bool = False
) -> None:
    """Add ``--json FILE`` (always), ``--plot FILE`` and ``--markdown FILE`` (where asked)."""
    parser.add_argument("--json", help="write the report to this JSON file")
    outputs = ["json"]
    if plot:
        parser.add_argument("--plot", help="write the plot to this PNG file")
        outputs.append("plot")
    if markdown:
        parser.add_argument("--markdown", help="write the table to this Markdown file")
        outputs.append("markdown")
    parser.set_defaults(outputs=tuple(outputs))


def write_json(path: str | None, report: Any) -> None:
    """Write ``report`` to ``path`` as indented JSON (creating folders); nothing if no path."""
    if path:
        write_text(path, json.dumps(report, indent=2))


def write_text(path: str | None, text: str) -> None:
    """Write ``text`` to ``path`` (creating folders); nothing if no path."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
