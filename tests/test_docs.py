"""docs/: the command-line reference is the parsers' own text, and every link between the pages
leads somewhere."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from streamsafe._clidoc import render

pytestmark = pytest.mark.unit

_ROOT = Path(__file__).resolve().parent.parent
_CLI_MD = _ROOT / "docs" / "cli.md"
_PAGES = [_ROOT / "README.md", *sorted((_ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_cli_reference_is_up_to_date():
    assert _CLI_MD.read_text() == render(), "docs/cli.md is stale: run `make docs`"


def test_cli_reference_lists_every_option_of_every_command():
    text = render()
    for command in ("demo", "serve", "simulate", "chat", "bench", "bench overload"):
        assert f"`streamsafe {command}`" in text
    for flag in ("--upstream UPSTREAM", "--commit {early,first-token}", "--fault SPEC", "prompt"):
        assert f"`{flag}`" in text


def test_cli_reference_does_not_depend_on_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("STREAMSAFE_UPSTREAM_API_KEY", "secret-from-someones-shell")
    text = render()
    assert "secret-from-someones-shell" not in text
    assert text == _CLI_MD.read_text()


def test_cli_reference_renders_defaults_choices_and_escapes_pipes():
    parser = argparse.ArgumentParser(prog="tool", description="A tool.")
    parser.add_argument("--mode", choices=("a", "b"), default="a", help="a | b (%(default)s)")
    parser.add_argument("--flag", action="store_true", help="on")
    parser.add_argument("--name", required=True, help="who")
    parser.add_argument("target", help="where")
    text = render(parser)
    assert "    tool [options] target" in text
    assert "| `--mode {a,b}` | `a` | a \\| b (a) |" in text
    assert "| `--flag` |  | on |" in text
    assert "| `--name NAME` |  | required; who |" in text


@pytest.mark.parametrize("page", _PAGES, ids=[p.name for p in _PAGES])
def test_relative_links_lead_to_files_and_headings(page: Path):
    for target in _LINK.findall(page.read_text()):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page.name}: broken link {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{page.name}: no heading for {target}"


def _anchors(page: Path) -> set[str]:
    # GitHub's rule: lower case, punctuation but hyphens and underscores dropped, spaces to
    # hyphens.
    found = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            slug = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            found.add(slug)
    return found
