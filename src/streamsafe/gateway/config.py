"""Gateway settings: one immutable value, every field documented where it is declared."""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

from streamsafe._redis_url import parse_redis_url
from streamsafe._url_userinfo import split_userinfo

__all__ = ["CollapseSetting", "CommitMode", "GatewayConfig", "UpstreamKindSetting"]

#: What the upstream is (see :mod:`streamsafe.gateway.upstream.kinds`); ``auto`` asks it.
UpstreamKindSetting = Literal["auto", "vllm", "ogx", "llama-stack", "openai"]

#: ``early``: answer 200 as soon as the request is admitted (and upstream did not refuse it), then
#: keep the connection warm with ``: keep-alive`` comments; ``first-token``: hold the headers until
#: the first event, so a failure before it keeps its real status.
CommitMode = Literal["early", "first-token"]

#: Which identical requests (same tenant, same body, no retry marker) share one generation
#: (``GatewayConfig.collapse_identical``): ``auto`` (default) those with one answer, greedy or
#: seeded, and plain calls; ``deterministic`` those with one answer only; ``all`` every one;
#: ``off`` none.
CollapseSetting = Literal["auto", "deterministic", "all", "off"]


@dataclasses.dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Settings of a :class:`~streamsafe.gateway.Gateway`.

    Defaults aim at a single vLLM behind the gateway with clients that use the Stainless defaults
    (60 s read timeout, 2 retries): waits stay well below 60 s and nothing a client abandons keeps
    running for long.
    """

    #: Base URL of the OpenAI-compatible engine (vLLM, the simulator). ``None`` is only meaningful
    #: to ``streamsafe serve``, which then starts the simulator in-process.
    upstream: str | None = "http://127.0.0.1:8000"
    #: What the upstream is: ``vllm`` (or anything with vLLM's API, the simulator included),
    #: ``ogx`` (today's Llama Stack, OGX 1.x and llama-stack >= 0.4: its OpenAI routes
    #: ``/v1/chat/completions`` and ``/v1/completions``; every other route passed through),
    #: ``llama-stack`` (Llama Stack 0.2: its native and ``/v1/openai/v1`` inference routes) or
    #: ``openai`` (any other OpenAI-compatible server). Default ``auto``: ask the upstream at
    #: start (and again while it has not answered) which routes it serves, and log what was
    #: found and what the gateway protects.
    upstream_kind: UpstreamKindSetting = "auto"
    #: Attach a request to a generation of the same tenant with a byte-identical body even when
    #: it carries no retry marker, while that generation runs or up to ``grace`` seconds after
    #: it finished. Behind a server (OGX, Llama Stack) a client's retry arrives as a fresh call
    #: with no marker; this makes it one generation. Default ``auto``: requests whose answer is
    #: determined (greedy, ``temperature`` 0, or seeded), where sharing changes no answer, and
    #: plain calls, which a server runs to the end after its client gave up (so the client's
    #: retry finds the first copy running; it finds one finished only where a copy already
    #: joined it while it ran; two users who send the same sampled plain call while it runs get
    #: one sample); sampled streams stay independent (a server cancels an abandoned stream, so a
    #: duplicate stream is a new wish for a sample).
    #: ``deterministic``: determined ones only; ``all``: sampled streams too; ``off``: none.
    collapse_identical: CollapseSetting = "auto"
    #: Seconds a generation keeps running after its last subscriber left (default 5: long enough
    #: for a client to reconnect and resume, short enough that abandoned work is freed). 0 aborts
    #: at once.
    grace: float = 5.0
    #: When a streaming response is committed (see :data:`CommitMode`). Default ``early``, which
    #: keeps a slow first token from tripping a client's read timeout (the original failure).
    commit: CommitMode = "early"
    #: Seconds between ``: keep-alive`` comments while a committed stream waits for its first
    #: event, and of silence after which one goes out once events flow (an engine stalled in
    #: the middle of an answer). Default 5, far below the 60 s read timeout of Stainless
    #: clients; a client that states a shorter one (``x-stainless-read-timeout``) gets them at
    #: half of it, at least 0.25 s apart. 0 sends none.
    heartbeat: float = 5.0
    #: Generations running upstream at once (default 256, vLLM's usual ``--max-num-seqs``).
    #: ``None`` for no limit.
    max_inflight: int | None = 256
    #: Keep a waiting non-streaming call's connection alive (default off): once it waited one
    #: commit wait (a heartbeat, at most 1 s), answer 200 and send a space every ``heartbeat``
    #: until the JSON answer follows (JSON allows leading whitespace), so a slow call never
    #: trips a client's read timeout and is never retried. The price: a failure after that
    #: arrives as a 200 whose body is the error object, not as an error status.
    json_keepalive: bool = False
    #: Engine memory budget in tokens: the sum over running generations of estimated prompt
    #: tokens + max_tokens. ``None`` (default) for no limit; set it to the engine's KV capacity.
    max_memory_tokens: int | None = None
    #: max_tokens assumed for a request that does not say (default 1024).
    default_max_tokens: int = 1024
    #: Requests waiting for admission (default 1024); past it, 429 at once.
    queue_size: int = 1024
    #: Seconds a request may wait for admission before it gets 429 (default 20: a client's 60 s
    #: read timeout must not fire while it waits, since no header is sent before admission).
    queue_timeout: float = 20.0
    #: Seconds a finished generation is kept for replay and resume (default 300).
    keep_finished: float = 300.0
    #: Bytes of finished generations kept; past it the oldest finished ones are evicted first
    #: (default 64 MiB).
    max_kept_bytes: int = 64 * 1024 * 1024
    #: Finished generations kept, whatever their size; past it the oldest are evicted first
    #: (default 20,000: bounds the bookkeeping of many tiny answers, each of which costs a few
    #: KiB however short, independently of the bytes estimate).
    max_kept_generations: int = 20_000
    #: API keys accepted as ``Authorization: Bearer <key>``; each key is a tenant. Empty (default):
    #: no authentication and one anonymous tenant.
    api_keys: tuple[str, ...] = ()
    #: ``(api_key, weight)`` pairs: a tenant's share of admission when tenants compete (default:
    #: 1 each, equal shares). A tenant of weight 2 is admitted twice as often as one of weight 1
    #: while both have requests waiting; alone, any tenant may use everything.
    tenant_weights: tuple[tuple[str, float], ...] = ()
    #: Largest request body accepted (default 4 MiB); larger gets 413.
    max_body_bytes: int = 4 * 1024 * 1024
    #: Bytes of request bodies held by queued and running generations, in all (default
    #: 256 MiB: 64 bodies at the 4 MiB limit, thousands of ordinary ones). A new generation
    #: whose body does not fit is shed (429 with ``Retry-After``) before it is queued, unless
    #: its tenant holds less than its share (see :mod:`streamsafe.gateway.admission.body_budget`).
    max_live_body_bytes: int = 256 * 1024 * 1024
    #: What a duplicate of a live keyed generation gets: ``attach`` (default: replay, then live)
    #: or ``409`` (the IETF Idempotency-Key draft's answer).
    on_live_duplicate: Literal["attach", "409"] = "attach"
    #: ``Authorization`` sent upstream (vLLM's ``--api-key``); client keys are never forwarded.
    upstream_api_key: str | None = None
    #: A PEM file of the CAs an ``https://`` upstream's certificate must chain to (a private CA,
    #: or the server's own self-signed certificate: OGX serves TLS unless told ``--insecure``).
    #: ``None``: the system's trusted CAs.
    upstream_ca_bundle: str | None = None
    #: Send the caller's own ``Authorization`` upstream on every route, for an upstream that
    #: authenticates its users itself (OGX with auth). Where the gateway has no ``api_keys``,
    #: each caller's credential is then a tenant of its own (known by its digest), so no caller
    #: attaches to another's generation; every route passes through whatever
    #: ``tenant_passthrough`` says, as the upstream tells its users' data apart. Default False:
    #: the caller's key is the gateway's business and never leaves it. Not with
    #: ``upstream_api_key`` (one ``Authorization``). The credential travels with the other
    #: forwarded headers: in Redis only sealed with ``redis_secret``.
    forward_authorization: bool = False
    #: What a refusal before any work (429/503, as a status or an error event before the first
    #: token) from the engine does. ``wait`` (default): the generation waits for room with the
    #: engine's other refused calls, one probe asking again with backoff and jitter, at most 6
    #: engine requests per call within ``queue_timeout`` (see docs/design.md, Commit), then the
    #: refusal with ``Retry-After`` and ``x-should-retry: false``. ``answer``: the refusal goes
    #: to the caller at once (an error event where it was answered already). Either way, while
    #: the engine refuses, a request with the same body gets the same answer without asking it
    #: again (``gateway/generations/refusals.py``).
    engine_refusals: Literal["wait", "answer"] = "wait"
    #: Seconds to connect upstream (default 5, as the Stainless clients).
    connect_timeout: float = 5.0
    #: Extra attempts after a refused connection (default 2); spent from a retry budget shared by
    #: all requests, so a dead upstream does not multiply the load.
    connect_retries: int = 2
    #: Seconds before the first connect retry (doubles each time; default 0.05).
    connect_backoff: float = 0.05
    #: Times a broken upstream chat stream is continued (default 5, 0 for never): when the
    #: connection to the engine breaks mid-stream with no error and no ``[DONE]``, the gateway
    #: asks the engine to continue the partial answer (``continue_final_message``) for the tokens
    #: still owed, and its subscribers see one unbroken stream. Generates nothing twice.
    max_continuations: int = 5
    #: Seconds between ``/health`` probes while the breaker is open (default 1).
    probe_interval: float = 1.0
    #: Upstream connections kept alive in the pool (default 512).
    max_keepalive: int = 512
    #: Seconds from sending a request upstream to its first event (default 60: vLLM's prefill of
    #: a long prompt behind a busy batch takes seconds, not a minute). Past it the attempt is
    #: closed (the engine aborts it) and that engine is not asked again for this generation
    #: (another engine of the model is, where there is one; else the caller gets a 504 or an
    #: error event). A frozen or killed engine is found sooner: its ``/health`` is asked once an
    #: attempt has been quiet a few seconds (docs/design.md, Failover). ``None`` for none.
    first_token_timeout: float | None = 60.0
    #: Seconds of silence allowed between two upstream chunks once events flow (default 35:
    #: longer than the pauses of a working engine, a preempted request recomputed or a 30 s stall
    #: that then goes on, which a continuation would only make longer; a frozen engine is found
    #: by its health check, not by this). Past it the stream is cut and continued, on another
    #: engine of the model where there is one. ``None`` for none.
    idle_timeout: float | None = 35.0
    #: Seconds a caller may wait for the next token of an answer that stalled (default 45): from
    #: its last event, through the cut and every continuation, until one sends a token. An
    #: answer silent for 30 s, cut, and continued on an engine that stalls again ends with a
    #: clear error event 45 s after it went quiet, not once per continuation later. ``None`` for
    #: none (each continuation then has the first-token timeout).
    stall_timeout: float | None = 45.0
    #: Seconds a generation may take upstream in all, continuations and waits included (default
    #: 600, Llama Stack's own read timeout). Past it the stream ends with an error event.
    #: ``None`` for none.
    total_timeout: float | None = 600.0
    #: What a tenant (an API key; with ``api_keys`` set) may pass through to the upstream:
    #: ``refuse`` (default) passes only routes that hold no tenant's data (``GET`` of the model
    #: list and of one model, ``/v1/health``, ``/v1/version``; see
    #: :func:`~streamsafe.gateway.serving.passthrough.shared_route`) and refuses the rest with 403,
    #: since every tenant reaches the upstream under the one ``upstream_api_key``, so Llama
    #: Stack's stored completions, responses, files, vector stores and agents would be shared
    #: between them; ``shared`` passes every route, for tenants that may share them (one team's
    #: keys). Without ``api_keys`` there is one tenant and everything passes.
    tenant_passthrough: Literal["refuse", "shared"] = "refuse"
    #: Bearer key that ``/stats`` and ``/metrics`` require (``None``, default: they are open, as a
    #: scraper on a private network expects). It is not a tenant key.
    admin_key: str | None = None
    #: OpenTelemetry spans per request, generation and upstream attempt, with ``traceparent``
    #: sent upstream (default False; needs ``streamsafe[otel]`` and a tracer provider: see
    #: :mod:`streamsafe.gateway.tracing`).
    tracing: bool = False
    #: Engines of a pool, each ``URL [models=a,b] [weight=W]`` (see
    #: :class:`~streamsafe.gateway.engines.pool.EngineSpec`); empty (default) for the one
    # ``upstream``.
    #: With a pool the gateway routes by model, picks the least loaded engine, fails over
    #: before the first token and continues a cut stream on another engine (see
    #: docs/design.md, Engine pool).
    engines: tuple[str, ...] = ()
    #: ``MODEL=OTHER`` pairs: OTHER answers when no engine of MODEL can, and takes MODEL's
    #: context-length 400s (default none).
    fallback_models: tuple[str, ...] = ()
    #: Attempts of one generation before its first token, across the pool (default 3: the
    #: first plus two failovers, as the Stainless clients' own retries).
    failover_attempts: int = 3
    #: URL of the Redis shared by several gateway replicas (``redis://``, ``rediss://``,
    #: ``unix://``, ``redis+sentinel://``, ``redis+cluster://``: :mod:`streamsafe._redis_url`);
    #: ``None`` (default) keeps everything in this process. With it, a retry or a resume that
    #: lands on any replica finds the generation another one runs (see docs/design.md,
    #: Replicas).
    redis_url: str | None = None
    #: CA certificates (PEM) a ``rediss://`` URL's server is verified against where the URL
    #: names none (``?ssl_ca_certs=``); ``None`` (default): the system's.
    redis_ca_certs: str | None = None
    #: A secret every replica sharing ``redis_url`` is given (``None``, default: none). With it
    #: the prompt, the provider data (``X-LlamaStack-Provider-Data``) and the idempotency key of
    #: a generation's Redis record, and its answer (the event log), are sealed (AES-GCM, see
    #: :mod:`streamsafe.gateway.replicas.record_seal`); without it the provider data is never
    #: written to Redis (a generation carrying it is not continued by another replica) and the
    #: prompt and the answer are kept there in clear.
    redis_secret: str | None = None
    #: Seconds of the lease a replica holds on each generation it runs (default 3, renewed
    #: every second): how long a dead replica's generations wait before another takes them over.
    lease: float = 3.0
    #: Seconds the Redis keys of a running generation outlive their replica's last renewal
    #: (default 3600, renewed every third of it): what a generation whose replica died and that
    #: no replica took over leaves in Redis is gone after it.
    orphan_ttl: float = 3600.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            # NaN passes every comparison below (nan < 0 is False) and then breaks a timer deep
            # in the transport; infinity is no number of seconds either (None says "none").
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{field.name} must be a finite number, not {value}")
        self._check_choices()
        self._check_credentials()
        self._check_numbers()
        if self.redis_url is not None:
            parse_redis_url(self.redis_url, ca_certs=self.redis_ca_certs)  # ValueError, redacted
        elif self.redis_ca_certs is not None:
            raise ValueError("redis_ca_certs without a redis_url")

    def _check_choices(self) -> None:
        """Each setting that names one of a few behaviours names one that exists."""
        if self.collapse_identical not in ("auto", "deterministic", "all", "off"):
            raise ValueError(
                "collapse_identical must be 'auto', 'deterministic', 'all' or 'off', "
                f"not {self.collapse_identical!r}"
            )
        if self.commit not in ("early", "first-token"):
            raise ValueError(f"commit must be 'early' or 'first-token', not {self.commit!r}")
        if self.upstream_kind not in ("auto", "vllm", "ogx", "llama-stack", "openai"):
            raise ValueError(
                "upstream_kind must be 'auto', 'vllm', 'ogx', 'llama-stack' or 'openai', "
                f"not {self.upstream_kind!r}"
            )
        if self.engine_refusals not in ("wait", "answer"):
            raise ValueError(
                f"engine_refusals must be 'wait' or 'answer', not {self.engine_refusals!r}"
            )
        if self.on_live_duplicate not in ("attach", "409"):
            raise ValueError("on_live_duplicate must be 'attach' or '409'")
        if self.tenant_passthrough not in ("refuse", "shared"):
            raise ValueError(
                f"tenant_passthrough must be 'refuse' or 'shared', not {self.tenant_passthrough!r}"
            )

    def _check_credentials(self) -> None:
        """Keys are never empty, and the upstream is sent one credential, not two."""
        if self.forward_authorization and self.upstream_api_key:
            raise ValueError(
                "forward_authorization sends the caller's Authorization upstream; "
                "upstream_api_key would send another: set one of them"
            )
        if self.forward_authorization and any(
            split_userinfo(url.split()[0])[1] is not None
            for url in (*self.engines, self.upstream or "")
            if url.strip()
        ):
            raise ValueError(
                "forward_authorization sends the caller's Authorization upstream; an upstream "
                "URL's user:password would send another: set one of them"
            )
        if any(not k for k in self.api_keys):
            raise ValueError("api keys must not be empty")
        if self.admin_key is not None and not self.admin_key:
            raise ValueError("admin_key must not be empty")

    def _check_numbers(self) -> None:
        """Durations, sizes, counts and weights within the range each has a meaning in."""
        for name in ("grace", "heartbeat", "queue_timeout", "keep_finished", "connect_backoff"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.probe_interval <= 0 or self.connect_timeout <= 0 or self.lease <= 0:
            raise ValueError("probe_interval, connect_timeout and lease must be > 0")
        if self.orphan_ttl < 3 * self.lease:
            raise ValueError("orphan_ttl must be at least three leases")
        if self.failover_attempts < 1:
            raise ValueError("failover_attempts must be >= 1")
        for name in ("max_inflight", "max_memory_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None")
        if self.queue_size < 0 or self.default_max_tokens < 1 or self.max_body_bytes < 1:
            raise ValueError("queue_size >= 0, default_max_tokens >= 1, max_body_bytes >= 1")
        if self.max_live_body_bytes < self.max_body_bytes:
            raise ValueError("max_live_body_bytes must be >= max_body_bytes")
        if self.connect_retries < 0 or self.max_kept_bytes < 0 or self.max_kept_generations < 0:
            raise ValueError(
                "connect_retries, max_kept_bytes and max_kept_generations must be >= 0"
            )
        for name in ("first_token_timeout", "idle_timeout", "stall_timeout", "total_timeout"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None")
        if any(not (w > 0 and w < float("inf")) for _, w in self.tenant_weights):
            raise ValueError("tenant weights must be > 0")
