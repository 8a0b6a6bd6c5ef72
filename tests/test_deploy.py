"""The container image and the Kubernetes manifests (deploy/docker, deploy/kubernetes) agree
with the gateway they run: every argument is one `streamsafe serve` takes, the ports are one
port, the probes answer from a real gateway started with the manifest's own arguments (and the
example Secret's settings file), the pod outlives the drain, the autoscaler's metric is one the
gateway exports. No image is built and no cluster is asked here: see deploy/README.md."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from streamsafe._config_file import apply
from streamsafe._version import __version__
from streamsafe.cli import build_parser
from streamsafe.gateway.metrics.exposition import exported_names
from streamsafe.gateway.serving import drain
from streamsafe_bench.processes import RedisServer, ServerProcess
from waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
KUBE = ROOT / "deploy" / "kubernetes"


# --- the Dockerfile -------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    found: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        found.append((word.upper(), rest.strip()))
        pending = ""
    assert not pending, "a continuation line at the end of the Dockerfile"
    return found


def _one(instruction: str, stage: list[tuple[str, str]]) -> str:
    values = [rest for word, rest in stage if word == instruction]
    assert len(values) == 1, (instruction, values)
    return values[0]


def _stages() -> dict[str, list[tuple[str, str]]]:
    """The instructions of each build stage, by the stage's name."""
    stages: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for word, rest in _instructions():
        if word == "FROM":
            image, _, name = rest.partition(" AS ")
            current = stages.setdefault(name.strip(), [("FROM", image.strip())])
        elif current is not None:
            current.append((word, rest))
    return stages


def _image_args() -> dict[str, str]:
    return dict(
        rest.split("=", 1) for word, rest in _instructions() if word == "ARG" and "=" in rest
    )


def test_the_image_builds_the_wheel_then_runs_it_as_a_user_on_python_312_slim() -> None:
    stages = _stages()
    assert list(stages) == ["builder", "runtime"]
    base = _image_args()["PYTHON_IMAGE"]
    assert base == "python:3.12-slim"
    assert all(_one("FROM", s) == "${PYTHON_IMAGE}" for s in stages.values())
    assert "pip wheel --no-deps" in _one("RUN", stages["builder"])
    runtime = stages["runtime"]
    install = _one("RUN", runtime)
    assert "--constraint /tmp/lock.txt" in install and "[gateway]" in install
    assert ("COPY", "requirements/lock.txt /tmp/lock.txt") in runtime
    assert ("COPY", "--from=builder /dist /tmp/dist") in runtime
    assert _one("STOPSIGNAL", runtime) == "SIGTERM"
    user = _one("USER", runtime).split(":")[0]
    assert user.isdigit() and int(user) > 0
    assert f"--uid {user}" in install


def test_the_build_context_holds_what_the_image_copies_and_nothing_else() -> None:
    # The context is the repository root, beside virtualenvs of gigabytes.
    ignore = DOCKERFILE.with_name("Dockerfile.dockerignore").read_text().splitlines()
    rules = [line for line in ignore if line and not line.startswith("#")]
    assert rules[0] == "*"
    allowed = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    copied = {
        source.rstrip("/")
        for word, rest in _instructions()
        if word == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    assert copied == allowed
    for path in allowed:
        assert (ROOT / path).exists(), path


def _entrypoint_and_cmd() -> list[str]:
    runtime = _stages()["runtime"]
    words: list[str] = json.loads(_one("ENTRYPOINT", runtime)) + json.loads(_one("CMD", runtime))
    return words


def _serve(argv: list[str]) -> argparse.Namespace:
    """``argv`` (starting with ``serve``) parsed by streamsafe's own parser; a flag it does not
    know or a value it refuses fails the test with argparse's message."""
    assert argv[0] == "serve", argv
    parser = build_parser("serve")
    serve = _serve_parser(parser)
    known = {o for action in serve._actions for o in action.option_strings}
    unknown = [w.split("=")[0] for w in argv if w.startswith("-") and w.split("=")[0] not in known]
    assert not unknown, f"not options of streamsafe serve: {unknown}"
    try:
        return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"streamsafe serve refuses {argv}")


def _serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser = action.choices["serve"]
            return found
    raise AssertionError("no serve command")


def test_the_image_command_is_one_streamsafe_serve_takes() -> None:
    words = _entrypoint_and_cmd()
    assert words[0] == "streamsafe"
    args = _serve(words[1:])
    assert args.host == "0.0.0.0"
    exposed = _one("EXPOSE", _stages()["runtime"])
    assert exposed == str(args.port)
    healthcheck = _one("HEALTHCHECK", _stages()["runtime"])
    assert f"127.0.0.1:{args.port}/health" in healthcheck


# --- the Kubernetes manifests ---------------------------------------------------------------


def _kustomization() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    return loaded


def _resources() -> dict[str, dict[str, Any]]:
    """The kustomization's resources by kind (one of each)."""
    found: dict[str, dict[str, Any]] = {}
    for name in _kustomization()["resources"]:
        for doc in yaml.safe_load_all((KUBE / name).read_text()):
            assert doc["kind"] not in found, doc["kind"]
            found[doc["kind"]] = doc
    return found


def _pod() -> dict[str, Any]:
    spec: dict[str, Any] = _resources()["Deployment"]["spec"]["template"]["spec"]
    return spec


def _container() -> dict[str, Any]:
    (container,) = _pod()["containers"]
    return dict(container)


def _example_secret() -> dict[str, str]:
    secret = yaml.safe_load((KUBE / "secret.example.yaml").read_text())
    assert secret["metadata"]["name"] == "streamsafe-gateway"
    data: dict[str, str] = secret["stringData"]
    return data


def _container_port(port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    ports = {p["name"]: p["containerPort"] for p in _container()["ports"]}
    return ports[port] if isinstance(port, str) else port


def test_every_file_here_is_in_the_kustomization_or_said_not_to_be() -> None:
    listed = set(_kustomization()["resources"])
    apart = {"kustomization.yaml", "secret.example.yaml", "prometheus-adapter-values.yaml"}
    assert {p.name for p in KUBE.glob("*.yaml")} == listed | apart
    (image,) = _kustomization()["images"]
    assert _container()["image"] == image["name"]
    assert image["newTag"] == __version__  # the image of this version's wheel


def test_the_container_arguments_are_ones_streamsafe_serve_takes(tmp_path: Path) -> None:
    container = _container()
    assert "command" not in container  # the image's entrypoint, streamsafe
    args = _serve(container["args"])
    assert args.host == "0.0.0.0"
    # The example Secret's settings file goes through the same parser (keys, kinds, values).
    config = tmp_path / "gateway.toml"
    config.write_text(_example_secret()["gateway.toml"])
    argv = [str(config) if a == args.config else a for a in container["args"]]
    parser = build_parser("serve")
    merged = apply(parser, _serve_parser(parser), argv, parser.parse_args(argv), str(config))
    assert merged.upstream and all(u.startswith("http") for u in merged.upstream)
    assert merged.redis.startswith("redis://")


def test_the_secret_holds_what_the_pod_reads_and_the_gateway_reads_those_names() -> None:
    pod, container, secret = _pod(), _container(), _example_secret()
    source = "\n".join(p.read_text() for p in (ROOT / "src" / "streamsafe").rglob("*.py"))
    for env in container["env"]:
        ref = env["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "streamsafe-gateway"
        assert ref["key"] in secret or ref.get("optional") is True, ref
        assert f'"{env["name"]}"' in source, f"the gateway never reads {env['name']}"
    (config,) = [v for v in pod["volumes"] if "secret" in v]
    assert [i["key"] for i in config["secret"]["items"]] == ["gateway.toml"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == config["name"]]
    assert _serve(container["args"]).config == f"{mount['mountPath']}/gateway.toml"


def test_one_port_from_the_image_to_the_service() -> None:
    container, resources = _container(), _resources()
    port = _serve(container["args"]).port
    assert [p["containerPort"] for p in container["ports"]] == [port]
    assert _one("EXPOSE", _stages()["runtime"]) == str(port)
    (service_port,) = resources["Service"]["spec"]["ports"]
    assert _container_port(service_port["targetPort"]) == port
    annotations = resources["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert _container_port(container[probe]["httpGet"]["port"]) == port


def test_liveness_is_health_and_readiness_is_ready() -> None:
    container = _container()
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"


def test_the_pod_outlives_its_drain() -> None:
    # The kubelet runs preStop, then sends SIGTERM, and kills at the grace period from the
    # start: the drain and the moment it gives readers to write the end must fit after preStop.
    container = _container()
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain_timeout = _serve(container["args"]).drain_timeout
    needed = float(pre_stop[1]) + drain_timeout + drain._LAST_WORDS_S
    assert _pod()["terminationGracePeriodSeconds"] > needed


def test_selectors_the_budget_and_the_autoscaler_name_the_gateway() -> None:
    resources = _resources()
    deployment = resources["Deployment"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert resources["Service"]["spec"]["selector"].items() <= labels.items()
    pdb = resources["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= labels.items()
    hpa = resources["HorizontalPodAutoscaler"]["spec"]
    target = hpa["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment["metadata"]["name"])
    assert hpa["minReplicas"] > pdb["maxUnavailable"]  # an eviction leaves one serving
    user = _one("USER", _stages()["runtime"]).split(":")[0]
    assert _pod()["securityContext"]["runAsUser"] == int(user)


def test_the_autoscaler_metric_is_one_the_gateway_exports() -> None:
    hpa = _resources()["HorizontalPodAutoscaler"]["spec"]
    named = [m["pods"]["metric"]["name"] for m in hpa["metrics"] if m["type"] == "Pods"]
    assert named
    exported = exported_names()
    assert set(named) <= exported, set(named) - exported
    adapter = yaml.safe_load((KUBE / "prometheus-adapter-values.yaml").read_text())
    served = set()
    for rule in adapter["rules"]["custom"]:
        series = re.match(r"[a-z_:]+", rule["seriesQuery"].strip("'"))
        assert series is not None and series.group(0) in exported, rule["seriesQuery"]
        served.add(re.sub(rule["name"]["matches"], rule["name"]["as"], series.group(0)))
    assert set(named) <= served


# --- a real gateway started as the Deployment starts it ---------------------------------------


@pytest.mark.timeout(90)
def test_a_gateway_started_with_the_manifest_answers_its_probes_and_drains(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    container, secret = _container(), _example_secret()
    redis = RedisServer().start()
    engine = ServerProcess("simulate", "--itl-ms", "20")
    gateway: ServerProcess | None = None
    try:
        # The example Secret with this machine's engine and Redis in it.
        settings = tomllib.loads(secret["gateway.toml"])
        assert set(settings) == {"upstream", "redis"}
        config = tmp_path / "gateway.toml"
        config.write_text(f'upstream = ["{engine.url}"]\nredis = "{redis.url}"\n')
        args = _serve(container["args"])
        argv = [str(config) if a == args.config else a for a in container["args"]]
        monkeypatch.setenv("STREAMSAFE_REDIS_SECRET", "k" * 64)
        # ServerProcess puts --host 127.0.0.1 --port 0 last, and the last one wins.
        gateway = ServerProcess(*argv)
        url = gateway.url
        assert httpx2.get(url + "/health", timeout=5).status_code == 200
        wait_until(lambda: httpx2.get(url + "/ready", timeout=5).status_code == 200, 20, "/ready")
        port = url.rsplit(":", 1)[1]
        check = _one("HEALTHCHECK", _stages()["runtime"]).split("CMD", 1)[1]
        words = json.loads(check.replace("127.0.0.1:8000", f"127.0.0.1:{port}"))
        assert words[0] == "python"
        ran = subprocess.run([sys.executable, *words[1:]], timeout=30, check=False)
        assert ran.returncode == 0, shlex.join(words)
        # SIGTERM, as the kubelet sends after preStop, while a stream runs: /ready says 503 (the
        # endpoint leaves the Service), /health stays 200 (no restart), the stream ends whole.
        answers: list[httpx2.Response] = []
        body = {
            "model": "sim-llama-8b",
            "messages": [{"role": "user", "content": "drain"}],
            "max_tokens": 150,  # 3 s at 20 ms a token: still running when asked
            "stream": True,
        }

        def stream() -> None:
            with httpx2.Client(timeout=30) as client:
                answers.append(client.post(url + "/v1/chat/completions", json=body))

        reader = threading.Thread(target=stream)
        reader.start()
        stats = engine.url + "/stats"
        wait_until(lambda: httpx2.get(stats, timeout=5).json()["generations_started"] == 1)
        gateway.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: any("drain_begun" in line for line in gateway.output), 10, "drain")
        assert httpx2.get(url + "/ready", timeout=5).status_code == 503
        health = httpx2.get(url + "/health", timeout=5)
        assert health.status_code == 200 and health.json() == {"status": "draining"}
        reader.join(30)
        (answer,) = answers
        assert answer.status_code == 200 and answer.text.rstrip().endswith("data: [DONE]")
        assert '"error"' not in answer.text
        assert gateway.proc.wait(args.drain_timeout) == 0  # exited inside the drain timeout
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()
        redis.stop()
