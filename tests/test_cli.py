"""The command line: help, version, and the benchmarks' smallest runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streamsafe import __version__
from streamsafe.cli import main


def test_version_is_printed(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert __version__ in capsys.readouterr().out


def test_help_lists_the_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "streamsafe.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    assert "streamsafe" in out
    assert "bench" in out


def test_bench_sse_reports_a_ratio_for_every_case(tmp_path):
    path = tmp_path / "sse.json"
    assert main(["bench", "sse", "--chunks", "200", "--rounds", "1", "--json", str(path)]) == 0
    report = json.loads(path.read_text())
    assert len(report["cases"]) == 8
    for case in report["cases"]:
        assert case["events"] == 201
        assert case["ratio"] > 0


def test_serve_sets_the_tenant_pass_through_and_the_send_timeout():
    from streamsafe.cli import build_parser
    from streamsafe.gateway.cli import build_config, build_limits

    args = build_parser().parse_args(["serve", "--api-key", "k"])
    assert build_config(args, "http://e").tenant_passthrough == "refuse"  # safe by default
    assert build_limits(args).send_timeout == 30.0
    argv = ["serve", "--api-key", "k", "--tenant-passthrough", "shared", "--send-timeout", "7"]
    args = build_parser().parse_args(argv)
    assert build_config(args, "http://e").tenant_passthrough == "shared"
    assert build_limits(args).send_timeout == 7.0


def test_a_command_missing_an_extra_says_which_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import streamsafe_bench.sse as bench_sse

    def without_openai(*_args: object, **_kwargs: object) -> None:
        raise ModuleNotFoundError("No module named 'openai'", name="openai")

    monkeypatch.setattr(bench_sse, "run", without_openai)
    assert main(["bench", "sse"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "needs openai" in err and "pip install './benchmarks[peers]'" in err


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--idle-timeout", "nan"], "--idle-timeout: expected a finite number >= 0"),
        (["serve", "--grace", "inf"], "--grace: expected a finite number >= 0, not 'inf'"),
        (["serve", "--header-timeout=-inf"], "--header-timeout: expected a finite number > 0"),
        (["serve", "--probe-interval", "0"], "--probe-interval: expected a finite number > 0"),
        (["serve", "--max-kept-mb", "NaN"], "--max-kept-mb: expected a finite number >= 0"),
        (["serve", "--drain-timeout=-1"], "--drain-timeout: expected a finite number >= 0"),
        (["serve", "--port", "70000"], "--port: expected an integer from 0 to 65535"),
        (["serve", "--max-continuations=-1"], "--max-continuations: expected an integer >= 0"),
        (["simulate", "--itl-ms", "nan"], "--itl-ms: expected a finite number >= 0"),
        (["chat", "--model", "m", "--timeout", "nan", "hi"], "--timeout: expected a finite"),
    ],
)
def test_a_number_option_refuses_nan_infinity_and_out_of_range_at_start(
    capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2  # argparse's usage error: nothing started
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err


def test_the_gateway_config_refuses_a_number_that_is_not_finite() -> None:
    from streamsafe.gateway.config import GatewayConfig

    for name in ("idle_timeout", "grace", "queue_timeout", "lease", "heartbeat"):
        with pytest.raises(ValueError, match=f"{name} must be a finite number, not nan"):
            GatewayConfig(**{name: float("nan")})
    with pytest.raises(ValueError, match="total_timeout must be a finite number, not inf"):
        GatewayConfig(total_timeout=float("inf"))
