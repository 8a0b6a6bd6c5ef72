"""Today's Llama Stack as a process on loopback, in front of an engine, for tests and the demo: OGX
1.5.0 (Llama Stack renamed) and llama-stack 0.7.3 (the last release under the old name).

Both need Python >= 3.12 and clash with this project's pins (another llama-stack-client), so each
lives in its own virtualenv, built by ``make ogx`` and ``make llamastack07`` (``.venv-ogx``,
``.venv-llamastack07``; pins in ``requirements/``). A :class:`Flavor` says what differs between
the two: the command (``ogx run CONFIG --insecure``, OGX serving TLS otherwise; ``llama stack run
CONFIG``), the prefix of their environment variables, the client their venv holds
(``ogx-client`` 1.5.0, ``llama-stack-client`` 0.7.5).

:class:`OGXServer` writes a run config (:func:`run_config`: only the inference API, one
``remote::vllm`` provider whose ``base_url`` is the engine's ``/v1`` base, sqlite stores in a
temporary directory, no model registered by hand: the server lists the engine's models at start
and serves each as ``vllm/<engine's id>``), starts the server with its logs as JSON lines (their
default rich rendering formats every traceback on the event loop, which after a storm of failures
kept a server busy for minutes), and waits until ``/v1/health`` answers 200. ``TIKTOKEN_CACHE_DIR``
points at the venv's copy of tiktoken's ``cl100k_base`` file, which their Responses provider
loads at start and would otherwise fetch from outside.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamsafe_bench.llamastack import LlamaStackServer

__all__ = [
    "FLAVORS",
    "LLAMA_STACK_07",
    "OGX",
    "Flavor",
    "OGXServer",
    "ServerUnavailable",
    "find_venv",
    "run_config",
    "self_signed",
]


@dataclass(frozen=True)
class Flavor:
    """One of today's Llama Stack servers, as this project builds and runs it."""

    #: What the tests and reports call it.
    name: str
    #: The server's release (its ``/v1/version``).
    version: str
    #: The virtualenv at the top of the checkout, and the variable that names another.
    venv: str
    venv_variable: str
    #: The command, under the venv's ``bin``, before the config's path.
    command: tuple[str, ...]
    #: Arguments after the config's path (OGX serves TLS unless told ``--insecure``).
    extra_args: tuple[str, ...]
    #: The prefix of the server's environment variables (``OGX_LOG_FORMAT``, ...).
    env_prefix: str
    #: The client its venv holds, and that client's version.
    client: str
    client_version: str


OGX = Flavor(
    name="ogx",
    version="1.5.0",
    venv=".venv-ogx",
    venv_variable="STREAMSAFE_OGX_VENV",
    command=("ogx", "run"),
    extra_args=("--insecure",),
    env_prefix="OGX",
    client="ogx-client",
    client_version="1.5.0",
)
LLAMA_STACK_07 = Flavor(
    name="llama-stack-0.7",
    version="0.7.3",
    venv=".venv-llamastack07",
    venv_variable="STREAMSAFE_LLAMASTACK07_VENV",
    command=("llama", "stack", "run"),
    extra_args=(),
    env_prefix="LLAMA_STACK",
    client="llama-stack-client",
    client_version="0.7.5",
)
#: Both, by name.
FLAVORS = {f.name: f for f in (OGX, LLAMA_STACK_07)}


class ServerUnavailable(RuntimeError):
    """The flavor's virtualenv is not there: ``make ogx`` / ``make llamastack07`` builds it."""


def find_venv(flavor: Flavor) -> Path:
    """The flavor's virtualenv: ``$<venv_variable>``, or its folder at the top of the checkout
    (``benchmarks/src/streamsafe_bench`` is three folders below it). Raises
    :class:`ServerUnavailable` where its command is missing."""
    named = os.environ.get(flavor.venv_variable)
    venv = Path(named) if named else Path(__file__).resolve().parents[3] / flavor.venv
    if not (venv / "bin" / flavor.command[0]).exists():
        target = "ogx" if flavor is OGX else "llamastack07"
        raise ServerUnavailable(
            f"no {flavor.name} {flavor.version} at {venv}: `make {target}` builds it"
        )
    return venv


def run_config(
    engine_url: str,
    state_dir: str | os.PathLike[str],
    *,
    port: int = 8321,
    provider_max_tokens: int = 4096,
    responses: bool = False,
    api_keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A run config (version 2, the same for both flavors) with only the inference API in front
    of one engine (``engine_url``: its base, ``/v1`` added unless present). The provider is
    ``vllm``, so the engine's models are served as ``vllm/<id>``. ``provider_max_tokens`` is the
    ``max_tokens`` the server sends where a request sets none. Stores live in ``state_dir``.
    ``responses``: the Responses API too (``/v1/responses``), with the APIs it depends on, each
    from its inline provider (sqlite-vec, file-search, local files). ``api_keys``: the server
    authenticates its callers, each with one of these keys as its bearer token
    (``local_api_key``)."""
    base = engine_url.rstrip("/")
    if not base.endswith("/v1"):
        base += "/v1"
    state = Path(state_dir)
    config: dict[str, Any] = {
        "version": 2,
        "distro_name": "streamsafe",
        "apis": ["inference"],
        "providers": {
            "inference": [
                {
                    "provider_id": "vllm",
                    "provider_type": "remote::vllm",
                    "config": {
                        "base_url": base,
                        "max_tokens": provider_max_tokens,
                        "api_token": "fake",
                    },
                }
            ]
        },
        "storage": {
            "backends": {
                "kv_default": {"type": "kv_sqlite", "db_path": str(state / "kvstore.db")},
                "sql_default": {"type": "sql_sqlite", "db_path": str(state / "sql_store.db")},
            },
            "stores": {
                "metadata": {"namespace": "registry", "backend": "kv_default"},
                "inference": {"table_name": "inference_store", "backend": "sql_default"},
            },
        },
        "registered_resources": {"models": []},
        "server": {"port": port, "host": "127.0.0.1"},
    }
    if api_keys:
        provider = {"type": "local_api_key", "api_keys": list(api_keys)}
        config["server"]["auth"] = {"provider_config": provider}
    if responses:
        _add_responses(config, state)
    return config


def _add_responses(config: dict[str, Any], state: Path) -> None:
    """Add the Responses API to a run ``config``, with the APIs it depends on, each from its
    inline provider (sqlite-vec, file-search, local files), their stores in ``state``."""
    config["apis"] += ["responses", "vector_io", "tool_runtime", "files"]
    kv, sql = "kv_default", "sql_default"
    config["providers"].update(
        {
            "vector_io": [
                {
                    "provider_id": "sqlite-vec",
                    "provider_type": "inline::sqlite-vec",
                    "config": {
                        "db_path": str(state / "sqlite_vec.db"),
                        "persistence": {"namespace": "vector_io::sqlite_vec", "backend": kv},
                    },
                }
            ],
            "tool_runtime": [
                {"provider_id": "file-search", "provider_type": "inline::file-search"}
            ],
            "files": [
                {
                    "provider_id": "files",
                    "provider_type": "inline::localfs",
                    "config": {
                        "storage_dir": str(state / "files"),
                        "metadata_store": {"table_name": "files_metadata", "backend": sql},
                    },
                }
            ],
            "responses": [
                {
                    "provider_id": "builtin",
                    "provider_type": "inline::builtin",
                    "config": {
                        "persistence": {"responses": {"table_name": "responses", "backend": sql}}
                    },
                }
            ],
        }
    )
    config["storage"]["stores"].update(
        {
            name: {"table_name": table, "backend": sql}
            for name, table in (
                ("conversations", "openai_conversations"),
                ("prompts", "prompts"),
                ("connectors", "connectors"),
            )
        }
    )


_SELF_SIGNED = """
import datetime, ipaddress, sys
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
key = ec.generate_private_key(ec.SECP256R1())
loopback = ipaddress.ip_address("127.0.0.1")
name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
now = datetime.datetime.now(datetime.timezone.utc)
cert = (
    x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
    .serial_number(x509.random_serial_number())
    .not_valid_before(now - datetime.timedelta(minutes=5))
    .not_valid_after(now + datetime.timedelta(days=1))
    .add_extension(x509.SubjectAlternativeName([x509.IPAddress(loopback)]), critical=False)
    .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    .sign(key, hashes.SHA256())
)
open(sys.argv[1], "wb").write(cert.public_bytes(serialization.Encoding.PEM))
open(sys.argv[2], "wb").write(key.private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"""


def self_signed(venv: Path, cert: Path, key: Path) -> None:
    """Write a self-signed certificate for ``127.0.0.1`` (a day long) and its key, made by the
    ``cryptography`` package the server's venv holds (this project's environment has none)."""
    subprocess.run(
        [str(venv / "bin" / "python"), "-c", _SELF_SIGNED, str(cert), str(key)],
        check=True,
        capture_output=True,
    )


class OGXServer(LlamaStackServer):
    """OGX 1.5.0 or llama-stack 0.7.3 (``flavor``) as a child process on a free loopback port.

    >>> with OGXServer("http://127.0.0.1:8000", flavor=OGX) as server:
    ...     httpx2.get(server.url + "/v1/models")  # vllm/<the engine's model>

    Started, waited for and stopped as :class:`~streamsafe_bench.llamastack.LlamaStackServer`
    (the engine must be serving at start: the server lists its models then). ``log_level`` is
    the server's for all its log categories (default ``warning``: a failed engine call shows,
    one JSON line each). ``venv`` defaults to :func:`find_venv`'s. ``tls``: serve HTTPS with a
    self-signed certificate for ``127.0.0.1`` (:attr:`ca_bundle`), as OGX does by default
    (without it OGX runs ``--insecure``). ``responses``: serve the Responses API too (see
    :func:`run_config`; OGX's venv has its providers' packages). ``api_keys``: the server
    authenticates its callers by these bearer tokens.
    """

    def __init__(
        self,
        engine_url: str,
        *,
        flavor: Flavor = OGX,
        venv: Path | None = None,
        port: int = 0,
        start_timeout: float = 120.0,
        provider_max_tokens: int = 4096,
        log_level: str = "warning",
        tls: bool = False,
        responses: bool = False,
        api_keys: tuple[str, ...] = (),
    ) -> None:
        self.flavor = flavor
        self.tls = tls
        self.responses = responses
        self.api_keys = api_keys
        self.venv = venv or find_venv(flavor)
        super().__init__(
            engine_url,
            "",
            port=port,
            start_timeout=start_timeout,
            provider_max_tokens=provider_max_tokens,
            log_level=log_level,
            python=str(self.venv / "bin" / "python"),
        )

    @property
    def url(self) -> str:
        """Base URL, ``https://127.0.0.1:P`` where the server serves TLS."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def ca_bundle(self) -> Path:
        """With ``tls``: the server's self-signed certificate, which a client trusts as its CA."""
        assert self.state_dir is not None, "not started"
        return self.state_dir / "cert.pem"

    def _verify(self) -> ssl.SSLContext | bool:
        return ssl.create_default_context(cafile=str(self.ca_bundle)) if self.tls else True

    @property
    def client_python(self) -> Path:
        """The venv's Python, which has the flavor's client (see ``client_calls``)."""
        return self.venv / "bin" / "python"

    def _launch(self) -> None:
        assert self.state_dir is not None
        flavor = self.flavor
        config = run_config(
            self.engine_url,
            self.state_dir,
            port=self.port,
            provider_max_tokens=self.provider_max_tokens,
            responses=self.responses,
            api_keys=self.api_keys,
        )
        extra_args = flavor.extra_args
        if self.tls:
            # The server's default (OGX's): TLS, here with a certificate made for 127.0.0.1.
            self_signed(self.venv, self.ca_bundle, self.state_dir / "key.pem")
            config["server"]["tls_certfile"] = str(self.ca_bundle)
            config["server"]["tls_keyfile"] = str(self.state_dir / "key.pem")
            extra_args = tuple(a for a in extra_args if a != "--insecure")
        config_path = self.state_dir / "config.yaml"
        config_path.write_text(json.dumps(config, indent=2))  # JSON is valid YAML
        prefix = flavor.env_prefix
        env = dict(os.environ)
        env[f"{prefix}_CONFIG_DIR"] = str(self.state_dir)
        env[f"{prefix}_LOGGING"] = f"all={self.log_level}"
        env[f"{prefix}_LOG_FORMAT"] = "json"
        env["TIKTOKEN_CACHE_DIR"] = str(self.venv / "tiktoken")
        env.setdefault("PYTHONUNBUFFERED", "1")
        command = [str(self.venv / "bin" / flavor.command[0]), *flavor.command[1:]]
        cmd = [*command, str(config_path), *extra_args, "--port", str(self.port)]
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop())
        self._proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
