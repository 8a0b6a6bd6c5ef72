"""``streamsafe serve --config FILE.toml``: the keys are the long option names, the command line
wins, and a bad file is one clear line."""

from __future__ import annotations

import argparse
import pathlib

import pytest

from streamsafe.cli import build_parser, main
from streamsafe_bench.processes import ServerProcess

GOOD = """\
port = 9100
upstream = ["http://10.0.0.5:8000", "http://10.0.0.6:8000 models=llama-70b weight=2"]
max-memory-tokens = 30000
queue_timeout = 12.5
json-keepalive = true
commit = "first-token"
api-key = ["key-a", "key-b"]
log-format = "json"
"""


def _parse(tmp_path: pathlib.Path, text: str, *argv: str) -> argparse.Namespace:
    from streamsafe._config_file import apply
    from streamsafe.cli import _subcommand

    path = tmp_path / "gateway.toml"
    path.write_text(text)
    full = ["serve", "--config", str(path), *argv]
    parser = build_parser()
    return apply(parser, _subcommand(parser, "serve"), full, parser.parse_args(full), str(path))


def test_a_file_sets_options_by_their_long_names(tmp_path: pathlib.Path) -> None:
    args = _parse(tmp_path, GOOD)
    assert args.port == 9100 and args.max_memory_tokens == 30000 and args.queue_timeout == 12.5
    assert args.upstream == [
        "http://10.0.0.5:8000",
        "http://10.0.0.6:8000 models=llama-70b weight=2",
    ]
    assert args.json_keepalive is True and args.commit == "first-token"
    assert args.api_key == ["key-a", "key-b"] and args.log_format == "json"
    assert args.grace == 5.0  # what the file does not name keeps its default


def test_the_command_line_wins_over_the_file(tmp_path: pathlib.Path) -> None:
    args = _parse(tmp_path, GOOD, "--port", "9200", "--upstream", "http://c:1", "--grace", "1")
    assert args.port == 9200 and args.grace == 1.0
    assert args.upstream == ["http://c:1"]  # a repeated option replaces the file's list
    assert args.api_key == ["key-a", "key-b"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("port = ", "not valid TOML"),
        ("prot = 8000", "unknown key 'prot' (did you mean 'port'?)"),
        ('port = "eighty"', "port: expected an integer from 0 to 65535, got 'eighty'"),
        ("max-inflight = 2.5", "max-inflight: expected an integer >= 0, got 2.5"),
        ("idle-timeout = nan", "idle-timeout: expected a finite number >= 0, got nan"),
        ("grace = inf", "grace: expected a finite number >= 0, got inf"),
        ("lease = 0", "lease: expected a finite number > 0, got 0"),
        ("max-kept = -1", "max-kept: expected an integer >= 0, got -1"),
        ('commit = "late"', "commit: 'late' is not one of early, first-token"),
        ('json-keepalive = "yes"', "json-keepalive: expected true or false"),
        ("config = 'other.toml'", "unknown key 'config'"),
    ],
)
def test_a_bad_file_is_one_clear_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], text: str, says: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"streamsafe serve: {path}: ") and says in err


def test_a_missing_file_is_one_clear_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--config", str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot read it" in err


def test_serve_runs_with_a_config_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('grace = 2.5\ncommit = "first-token"\nsim-memory-tokens = 4096\n')
    server = ServerProcess("serve", "--config", str(path))  # its --port 0 wins over none
    try:
        announced = "".join(server.output)
        assert "commit first-token, grace 2.5 s" in announced
    finally:
        server.stop()


def test_a_file_that_is_not_utf8_is_one_clear_line(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'port = 8000\nadmin-key = "caf\xe9-secret"\n')
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "not valid TOML: not UTF-8 at byte" in err and "secret" not in err


@pytest.mark.parametrize(
    "text",
    [
        "upstream-api-key = 31415926535",
        'redis-secret = ["s3cr3t-31415926535"]',
        "admin-key = { k = 's3cr3t-31415926535' }",
        'api-key = ["ok", 31415926535]',
        'json-keepalive = "s3cr3t-31415926535"',
    ],
)
def test_an_error_never_repeats_a_secret_from_the_file(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    path = tmp_path / "secret.toml"
    path.write_text(text)
    assert main(["serve", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "31415926535" not in err and "expected" in err


def test_a_bad_tenant_weight_never_repeats_the_tenant_key(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "weights.toml"
    path.write_text('upstream = ["http://127.0.0.1:9"]\ntenant-weight = ["tenant-s3cr3t=nan"]\n')
    assert main(["serve", "--config", str(path)]) == 2
    out = capsys.readouterr()
    said = out.out + out.err
    assert "--tenant-weight wants KEY=WEIGHT" in said and "KEY='nan'" in said
    assert "s3cr3t" not in said and "Traceback" not in said
