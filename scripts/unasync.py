"""Generate the synchronous client from the asynchronous one (httpcore's way).

``src/streamsafe/client/_async.py`` is the source; ``_sync.py`` is written from it by the
substitutions below, then sorted and formatted by ruff, so one fix reaches both twins. What
truly differs between them (sleeping, closing a stream abandoned by a loop) lives in the
hand-written ``_async_support.py`` / ``_sync_support.py``, which the import is rewritten to.

    python scripts/unasync.py          # rewrite _sync.py
    python scripts/unasync.py --check  # exit 1 with a diff when _sync.py is not what it gives

The package ``unasync`` rewrites tokens only, so it would leave docstrings and comments saying
``async for`` and ``aclose`` in the synchronous client; these line rules rewrite them too.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAIRS = [
    (
        ROOT / "src/streamsafe/client/_async.py",
        ROOT / "src/streamsafe/client/_sync.py",
    ),
]


# In order, on whole words. Names that start with ``Async`` lose it (AsyncClient -> Client,
# httpx2.AsyncClient -> httpx2.Client, AsyncIterator -> Iterator).
def _word(pattern: str) -> re.Pattern[str]:
    return re.compile(r"(?<!\w)" + pattern + r"(?!\w)")


SUBS = [
    (_word("_async_support"), "_sync_support"),
    (_word(r"Async([A-Z]\w*)"), r"\1"),
    (_word("An asynchronous"), "A synchronous"),
    (_word("The asynchronous"), "The synchronous"),
    (_word("async def"), "def"),
    (_word("async with"), "with"),
    (_word("async for"), "for"),
    (re.compile(r"\bawait "), ""),
    (re.compile(r"  # noqa: ASYNC109"), ""),  # a sync function may take a timeout
    (_word("aclose"), "close"),
    (_word("aiter_bytes"), "iter_bytes"),
    (_word("aread"), "read"),
    (_word("anext"), "next"),
    (_word("__aenter__"), "__enter__"),
    (_word("__aexit__"), "__exit__"),
    (_word("__aiter__"), "__iter__"),
    (_word("__anext__"), "__next__"),
    (_word(r"asyncio\.sleep"), "time.sleep"),
]

HEADER = (
    "# Generated from _async.py by scripts/unasync.py: do not edit. Change _async.py (or the\n"
    "# rules in the script) and run `make unasync`; `make lint` fails while the two differ.\n"
)


def unasync(source: str) -> str:
    """The synchronous twin of ``source``, before ruff sorts and formats it."""
    lines = []
    for line in source.splitlines(keepends=True):
        for regex, repl in SUBS:
            line = regex.sub(repl, line)
        lines.append(line)
    return HEADER + "".join(lines)


def _ruff(args: list[str], text: str, path: Path) -> str:
    config = ["--config", str(ROOT / "pyproject.toml")]
    cmd = [sys.executable, "-m", "ruff", *args, *config, "--stdin-filename", str(path), "-"]
    done = subprocess.run(cmd, input=text, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        sys.exit(f"ruff {' '.join(args)} failed on the generated {path.name}:\n{done.stderr}")
    return done.stdout


def generate(src: Path, dst: Path) -> str:
    """What ``dst`` must hold: ``src`` unasynced, imports sorted, formatted."""
    text = unasync(src.read_text())
    text = _ruff(["check", "--fix", "--select", "I", "--quiet", "--exit-zero"], text, dst)
    return _ruff(["format", "--quiet"], text, dst)


def _relative(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="report drift (exit 1) instead of rewriting"
    )
    args = parser.parse_args(argv)
    drift = False
    for src, dst in PAIRS:
        want = generate(src, dst)
        have = dst.read_text() if dst.exists() else ""
        if want == have:
            continue
        if args.check:
            drift = True
            rel_src, rel_dst = _relative(src), _relative(dst)
            sys.stdout.writelines(
                difflib.unified_diff(
                    have.splitlines(keepends=True),
                    want.splitlines(keepends=True),
                    f"{rel_dst} (on disk)",
                    f"{rel_dst} (generated from {rel_src})",
                )
            )
            print(f"\n{rel_dst} is not what {rel_src} generates: run `make unasync`.")
        else:
            dst.write_text(want)
            print(f"wrote {_relative(dst)}")
    return 1 if drift else 0


if __name__ == "__main__":
    sys.exit(main())
