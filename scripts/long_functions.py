"""List the functions in ``src/streamsafe`` and ``benchmarks/src/streamsafe_bench`` longer than
a reader can hold, and fail on the unexplained ones.

A function (or method) counts from its ``def`` line (decorators aside) to its last line. One
over ``LIMIT`` lines must either be split into named helpers or say why it is not: a comment line
starting with ``# Long because`` after its docstring (or its ``def`` line where it has none) and
no further than ``WINDOW`` lines into the statements that follow. The generated
synchronous client (``client/_sync.py``) is skipped: its source, ``client/_async.py``, is held to
the rule instead.

    python scripts/long_functions.py          # list the long functions; exit 1 if one lacks why
    python scripts/long_functions.py --all    # every function over the limit, explained or not
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "streamsafe"
#: The packages held to the rule: streamsafe's and the benchmarks' (their own distribution).
SOURCES = (SRC, ROOT / "benchmarks" / "src" / "streamsafe_bench")
#: About a screen (STYLE.md: "a function a reader can hold").
LIMIT = 60
#: How far into the body the ``# Long because`` comment may sit.
WINDOW = 5
MARKER = "# Long because"
#: Written by scripts/unasync.py from _async.py, which is checked in its place.
GENERATED = {SRC / "client" / "_sync.py"}


@dataclass(frozen=True)
class LongFunction:
    """One function over the limit: where it is, how long, and whether it says why."""

    path: Path
    name: str
    line: int
    length: int
    explained: bool

    def __str__(self) -> str:
        path = self.path.relative_to(ROOT) if self.path.is_relative_to(ROOT) else self.path
        where = f"{path}:{self.line}"
        note = "explained" if self.explained else "NOT EXPLAINED"
        return f"{where}: {self.name} is {self.length} lines ({note})"


def _window(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    """The lines where the marker may sit: after the docstring (or the ``def`` line), through
    the first ``WINDOW`` lines of the statements that follow it."""
    body = node.body
    first = body[0]
    docstring = (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    )
    start = (first.end_lineno or first.lineno) + 1 if docstring else node.lineno + 1
    after = body[1] if docstring and len(body) > 1 else first
    end = max(start, after.lineno) + WINDOW - 1
    return lines[start - 1 : end]


def _explained(lines: list[str], node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(line.strip().startswith(MARKER) for line in _window(lines, node))


def _qualified(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function in ``tree`` with its dotted name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def long_functions(src: Path = SRC) -> list[LongFunction]:
    """Every function under ``src`` over ``LIMIT`` lines, generated files aside."""
    result = []
    for path in sorted(src.rglob("*.py")):
        if path in GENERATED:
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.splitlines()
        for name, node in _qualified(ast.parse(text, filename=str(path))):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > LIMIT:
                explained = _explained(lines, node)
                result.append(LongFunction(path, name, node.lineno, length, explained))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="list the explained ones too")
    args = parser.parse_args(argv)
    found = [f for src in SOURCES for f in long_functions(src)]
    unexplained = [f for f in found if not f.explained]
    for function in found if args.all else unexplained:
        print(function)
    if unexplained:
        print(
            f"{len(unexplained)} function(s) over {LIMIT} lines without a '{MARKER}' comment"
            f" in their first {WINDOW} body lines: split them, or say why not.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
