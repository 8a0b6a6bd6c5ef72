"""One logging setup for every command: levels, formats, and -v wherever it is given."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator

import orjson
import pytest

from streamsafe import _logging
from streamsafe.cli import build_parser

pytestmark = pytest.mark.unit


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logging.getLogger("streamsafe").level)
    yield
    for handler in root.handlers[:]:
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    logging.getLogger("streamsafe").setLevel(saved[2])


def test_verbose_is_accepted_after_the_subcommand_and_adds_to_the_count_before_it() -> None:
    parser = build_parser()
    assert _logging.chosen(parser.parse_args(["serve", "-v"]), "info") == ("info", 1, "text")
    args = parser.parse_args(["-v", "serve", "-vv", "--log-format", "json"])
    assert _logging.chosen(args, "info") == ("info", 3, "json")
    args = parser.parse_args(["bench", "-v", "overhead", "-v", "--log-level", "error"])
    assert _logging.chosen(args, "warning") == ("error", 2, "text")
    assert _logging.chosen(parser.parse_args(["chat", "--model", "m", "hi"]), "warning") == (
        "warning",
        0,
        "text",
    )


def test_json_lines_are_one_object_each_with_the_record_fields(restore_logging: None) -> None:
    out = io.StringIO()
    _logging.setup("info", 0, "json", stream=out)
    log = logging.getLogger("streamsafe.access")
    log.info("POST /v1/x 200", extra={"fields": {"request_id": "r1", "status": 200}})
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("streamsafe.gateway").exception("failed")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    first, second = (orjson.loads(line) for line in lines)
    assert first["msg"] == "POST /v1/x 200" and first["level"] == "info"
    assert first["logger"] == "streamsafe.access" and first["ts"].endswith("Z")
    assert first["request_id"] == "r1" and first["status"] == 200
    assert "ValueError: boom" in second["exc"]


def test_text_lines_carry_fields_as_key_value(restore_logging: None) -> None:
    out = io.StringIO()
    _logging.setup("info", 0, "text", stream=out)
    logging.getLogger("streamsafe.gateway").warning(
        "engine down", extra={"fields": {"engine": "http://a:1", "why": "two words"}}
    )
    line = out.getvalue().strip()
    assert " WARNING streamsafe.gateway engine down engine=http://a:1 " in line
    assert line.endswith('why="two words"')


#: What a caller can put in a path or a header to forge a text line or drive a terminal: a
#: newline, a carriage return, ESC (a CSI sequence), DEL, C1's one-character CSI and NEL, the
#: Unicode line and paragraph separators.
FORGERIES = (
    "\n2026-01-01T00:00:00.000Z INFO streamsafe.access FAKE\r\x1b[2J\x7f\x9b\x85\u2028\u2029"
)
_RECORD_START = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [A-Z]+ streamsafe")


def test_a_text_line_escapes_what_could_forge_a_line_or_drive_a_terminal(
    restore_logging: None,
) -> None:
    out = io.StringIO()
    _logging.setup("info", 0, "text", stream=out)
    log = logging.getLogger("streamsafe.access")
    log.info("GET %s 404", "/v1/a" + FORGERIES, extra={"fields": {"path": FORGERIES, "x": "a b"}})
    try:
        raise ValueError("bad" + FORGERIES)
    except ValueError:
        log.exception("failed on %s", "/v1/b" + FORGERIES)
    text = out.getvalue()
    lines = text.splitlines()  # splits at every line break Python knows, U+2028 included
    assert text.count("\n") == len(lines) and not re.search(
        "[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]", text
    )
    records = [line for line in lines if not line.startswith("  ")]
    assert len(records) == 2 and all(_RECORD_START.match(line) for line in records)
    assert "/v1/a\\n2026-01-01T00:00:00.000Z INFO streamsafe.access FAKE\\r\\x1b[2J" in records[0]
    assert "\\x7f\\x9b\\x85\\u2028\\u2029" in records[0] and 'x="a b"' in records[0]
    # A traceback keeps its line breaks, each of its lines indented: no record starts there.
    assert "  ValueError: bad" in lines and any(
        line.startswith("  2026-01-01T00:00:00.000Z INFO") for line in lines
    )


def test_other_libraries_stay_at_warning_unless_asked(restore_logging: None) -> None:
    out = io.StringIO()
    _logging.setup("debug", 0, "text", stream=out)
    logging.getLogger("httpcore2.connection").debug("connect_tcp.started")
    logging.getLogger("uvicorn.error").info("Started server process")
    logging.getLogger("streamsafe.gateway").debug("ours")
    assert out.getvalue().count("\n") == 1 and "ours" in out.getvalue()
    _logging.setup("info", 3, "text", stream=out)  # -vvv: everything
    logging.getLogger("httpcore2.connection").debug("connect_tcp.started")
    assert "connect_tcp.started" in out.getvalue()


def test_the_default_level_shows_info_for_the_servers_and_warning_for_the_tools() -> None:
    from streamsafe.cli import _DEFAULT_LEVEL

    assert _DEFAULT_LEVEL.get("serve") == "info"
    assert _DEFAULT_LEVEL.get("demo", "warning") == "warning"
