"""The simulator's settings: :class:`SimConfig` (one immutable value), :class:`Fault` (one
injected failure with its probability), parsed from the command line's ``--fault`` specs, and
:class:`Flap` (an engine that fails in periods, ``--flap``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal, cast

__all__ = ["Fault", "FaultKind", "FaultTarget", "Flap", "FlapFailure", "SimConfig"]

FaultKind = Literal[
    "status",
    "errorevent",
    "cut",
    "stall",
    "pause",
    "reset",
    "hang",
    "malformed",
    "nodone",
    "blackhole",
    "crash",
]
#: Which requests a fault may hit: ``any``, ``fresh`` ones, or ``continuation`` requests
#: (``continue_final_message: true``).
FaultTarget = Literal["any", "fresh", "continuation"]
_TARGETS = ("any", "fresh", "continuation")


@dataclass(frozen=True)
class Fault:
    """One injected failure, drawn per request with ``probability`` (1.0 = always).

    Specs, as ``--fault`` takes them (:meth:`parse`):

    - ``status:CODE:P[:RETRY_AFTER]``: answer ``CODE`` with an OpenAI-style error body before any
      work; 429 and 503 carry ``Retry-After`` (default 1 s, as a shedding server sends;
      ``none``: no header, as vLLM's own 503 past ``--max-num-queued-reqs``).
    - ``errorevent:CODE:P``: a streaming request is answered 200, then a first event that is an
      error carrying ``CODE`` and ``[DONE]``, before any work: vLLM 0.32's second form of load
      shedding (``--max-num-queued-reqs``). A non-streaming one gets the status, as ``status``.
    - ``cut:N:P`` or ``cut:LO-HI:P``: close the connection abruptly after N data events (or a
      count drawn from [LO, HI]), with no ``[DONE]`` and no error event, as a crashed proxy does.
      Streaming requests only.
    - ``stall:SECONDS:P``: hold the request that long before it reaches the engine, so the first
      token is late by that much (headers still go out at once unless held for the first token).
    - ``pause:N:SECONDS:P``: after N data events the stream goes silent for SECONDS, then goes
      on (what was generated meanwhile follows at once), as from an engine that stalls in the
      middle of an answer. Streaming requests only.
    - ``reset:P``: reset the connection (TCP RST) before any response byte, as an engine process
      killed mid-request or a proxy does.
    - ``hang:N:P``: after N data events the stream goes silent with the connection open, as from
      a frozen engine; it never resumes (the request is dropped when the client leaves).
    - ``malformed:N:P``: after N data events one event whose data is not JSON (a truncated
      chunk), then the stream goes on.
    - ``nodone:P``: the stream ends cleanly after its last chunk but without ``data: [DONE]``.
    - ``blackhole:P``: the request is read and never answered, not even a status line, until
      the client leaves: an engine that accepts connections and is silent.
    - ``crash:N:P``: after N data events the engine dies (every live generation fails,
      ``/health`` answers 503 and every later request 500, until ``/admin/restart``) and this
      stream's connection is cut without an error event, as a crashed engine process drops it.
      Streaming requests only.

    Any spec may end in ``@fresh`` or ``@continuation`` (hit only those requests) and in
    ``#TIMES`` (hit at most that many requests), e.g. ``status:503:1@continuation#1``.
    """

    kind: FaultKind
    #: Chance per request, in [0, 1].
    probability: float
    #: ``status``, ``errorevent``: the HTTP status to answer (or carry in the error event).
    status: int = 0
    #: ``status``: Retry-After seconds sent with 429/503 (None: no header).
    retry_after: float | None = None
    #: ``cut``: the fewest and most data events sent before the cut.
    cut_low: int = 0
    cut_high: int = 0
    #: ``stall``: seconds of delay before the request is admitted; ``pause``: seconds of silence.
    stall_s: float = 0.0
    #: ``hang``, ``malformed``, ``pause``, ``crash``: data events sent before the fault.
    after: int = 0
    #: Which requests it may hit (see :data:`FaultTarget`).
    target: FaultTarget = "any"
    #: Most requests it hits (``None``: no bound).
    times: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"fault probability must be in [0, 1], got {self.probability}")
        if self.kind in ("status", "errorevent") and not 400 <= self.status <= 599:
            raise ValueError(f"{self.kind} fault needs a 4xx/5xx code, got {self.status}")
        if self.kind == "cut" and not 0 <= self.cut_low <= self.cut_high:
            raise ValueError(f"cut fault needs 0 <= LO <= HI, got {self.cut_low}-{self.cut_high}")
        if self.kind in ("stall", "pause") and self.stall_s < 0:
            raise ValueError(f"{self.kind} fault needs seconds >= 0, got {self.stall_s}")
        if self.after < 0:
            raise ValueError(f"{self.kind} fault needs N >= 0, got {self.after}")
        if self.target not in _TARGETS:
            raise ValueError(f"fault target must be one of {_TARGETS}, got {self.target!r}")
        if self.times is not None and self.times < 1:
            raise ValueError(f"fault times must be >= 1, got {self.times}")

    def hits(self, continuation: bool) -> bool:
        """Whether this fault may hit a request (a continuation or not), its target alone."""
        if self.target == "any":
            return True
        return (self.target == "continuation") == continuation

    @classmethod
    def parse(cls, spec: str) -> Fault:
        """Parse ``status:503:0.1``, ``errorevent:503:0.1``, ``cut:20:0.05``, ``cut:5-40:0.2``,
        ``stall:0.5:1``, ``pause:5:6:1``, ``reset:0.1``, ``hang:3:1``, ``malformed:4:1``,
        ``nodone:1``, ``blackhole:1``, ``crash:5:1``, each optionally followed by
        ``@fresh`` / ``@continuation`` and ``#TIMES``.

        Raises ValueError with the expected forms on anything else."""
        body, _, times_s = spec.strip().partition("#")
        body, _, target = body.partition("@")
        try:
            if (target or "any") not in _TARGETS:
                raise ValueError(f"target must be one of {_TARGETS}")
            fault = cls._parse_body(body.split(":"))
            if fault is not None:
                return dataclasses.replace(
                    fault,
                    target=cast(FaultTarget, target or "any"),
                    times=int(times_s) if times_s else None,
                )
        except ValueError as exc:
            raise ValueError(f"bad fault spec {spec!r}: {exc}") from None
        raise ValueError(
            f"bad fault spec {spec!r}: expected status:CODE:P[:RETRY_AFTER], errorevent:CODE:P, "
            "cut:N:P, cut:LO-HI:P, stall:SECONDS:P, pause:N:SECONDS:P, reset:P, hang:N:P, "
            "malformed:N:P, nodone:P, blackhole:P or crash:N:P, "
            "optionally followed by @fresh or @continuation and #TIMES"
        )

    @classmethod
    def _parse_body(cls, parts: list[str]) -> Fault | None:
        """The fault of a spec without its ``@TARGET`` and ``#TIMES`` (``None``: no such form)."""
        kind = parts[0]
        if kind == "status" and len(parts) in (3, 4):
            code = int(parts[1])
            retry_after: float | None = None
            if len(parts) == 4:
                retry_after = None if parts[3] == "none" else float(parts[3])
            elif code in (429, 503):
                retry_after = 1.0
            return cls("status", float(parts[2]), status=code, retry_after=retry_after)
        if kind == "cut" and len(parts) == 3:
            lo, _, hi = parts[1].partition("-")
            low = int(lo)
            high = int(hi) if hi else low
            return cls("cut", float(parts[2]), cut_low=low, cut_high=high)
        if kind == "errorevent" and len(parts) == 3:
            return cls("errorevent", float(parts[2]), status=int(parts[1]))
        if kind == "stall" and len(parts) == 3:
            return cls("stall", float(parts[2]), stall_s=float(parts[1]))
        if kind == "pause" and len(parts) == 4:
            return cls("pause", float(parts[3]), after=int(parts[1]), stall_s=float(parts[2]))
        if kind in ("hang", "malformed", "crash") and len(parts) == 3:
            return cls(cast(FaultKind, kind), float(parts[2]), after=int(parts[1]))
        if kind in ("reset", "nodone", "blackhole") and len(parts) == 2:
            return cls(cast(FaultKind, kind), float(parts[1]))
        return None

    def __str__(self) -> str:
        p = f"{self.probability:g}"
        if self.kind == "status":
            if self.retry_after is not None:
                tail = f":{self.retry_after:g}"
            else:
                tail = ":none" if self.status in (429, 503) else ""
            text = f"status:{self.status}:{p}{tail}"
        elif self.kind == "cut":
            n = (
                str(self.cut_low)
                if self.cut_low == self.cut_high
                else f"{self.cut_low}-{self.cut_high}"
            )
            text = f"cut:{n}:{p}"
        elif self.kind == "errorevent":
            text = f"errorevent:{self.status}:{p}"
        elif self.kind == "stall":
            text = f"stall:{self.stall_s:g}:{p}"
        elif self.kind == "pause":
            text = f"pause:{self.after}:{self.stall_s:g}:{p}"
        elif self.kind in ("hang", "malformed", "crash"):
            text = f"{self.kind}:{self.after}:{p}"
        else:
            text = f"{self.kind}:{p}"
        if self.target != "any":
            text += f"@{self.target}"
        if self.times is not None:
            text += f"#{self.times}"
        return text


#: How a flapping engine fails while it is down: ``503`` answers every request 503 with
#: ``Retry-After: 1`` (``/health`` included), ``reset`` resets every connection (TCP RST).
FlapFailure = Literal["503", "reset"]
_FLAP_FAILURES = ("503", "reset")


@dataclass(frozen=True)
class Flap:
    """An engine that alternates healthy and failing periods, on a fixed schedule from the
    moment the simulator starts: up for ``up_s``, down for ``down_s``, up again, and so on.
    Deterministic, so a test knows when each period falls. While down it fails every route but
    ``/stats`` (a test reads that) the way ``failure`` says; a stream already flowing when a
    down period begins goes on (the engine refuses new work, as one restarting behind a proxy
    does).

    ``--flap UP:DOWN[:FAILURE]`` (:meth:`parse`), e.g. ``--flap 2:3:503``."""

    #: Seconds of each healthy period (the first period is healthy, so a gateway starts).
    up_s: float
    #: Seconds of each failing period.
    down_s: float
    #: How it fails while down (default ``503``, see :data:`FlapFailure`).
    failure: FlapFailure = "503"

    def __post_init__(self) -> None:
        if self.up_s <= 0 or self.down_s <= 0:
            raise ValueError(f"flap needs UP > 0 and DOWN > 0, got {self.up_s}:{self.down_s}")
        if self.failure not in _FLAP_FAILURES:
            raise ValueError(f"flap failure must be one of {_FLAP_FAILURES}, got {self.failure!r}")

    def down_for(self, elapsed: float) -> float:
        """Seconds the down period that holds ``elapsed`` (seconds since the start) has left;
        0.0 while up."""
        period = self.up_s + self.down_s
        phase = elapsed % period
        return 0.0 if phase < self.up_s else period - phase

    @classmethod
    def parse(cls, spec: str) -> Flap:
        """Parse ``UP:DOWN`` or ``UP:DOWN:FAILURE`` (``503`` or ``reset``)."""
        parts = spec.strip().split(":")
        try:
            if len(parts) not in (2, 3):
                raise ValueError("expected UP:DOWN[:503|reset]")
            failure = parts[2] if len(parts) == 3 else "503"
            return cls(float(parts[0]), float(parts[1]), cast(FlapFailure, failure))
        except ValueError as exc:
            raise ValueError(f"bad flap spec {spec!r}: {exc}") from None

    def __str__(self) -> str:
        return f"{self.up_s:g}:{self.down_s:g}:{self.failure}"


@dataclass(frozen=True)
class SimConfig:
    """Everything that shapes one simulated vLLM server. Defaults follow a small vLLM
    deployment (an 8B model on one GPU): enough to be realistic, small enough to overload."""

    #: The one model served; requests naming another get 404, as vLLM answers.
    model: str = "sim-llama-8b"
    #: KV memory in tokens. Waiting requests hold their prompt, running ones prompt + generated;
    #: passing it kills the engine.
    memory_tokens: int = 32768
    #: Most requests running at once (vLLM's ``--max-num-seqs``); the rest wait, unbounded.
    max_num_seqs: int = 64
    #: Prefill time per prompt token, added to the step that schedules the request.
    prefill_ms_per_token: float = 0.05
    #: Base time of one decode step (every running request gets one token per step).
    itl_ms: float = 10.0
    #: Extra step time per running request: a loaded engine is slower.
    itl_ms_per_seq: float = 0.1
    #: ``max_tokens`` when a request gives none; a continuation (``continue_final_message``) gets
    #: it less the words of its partial answer, as vLLM's context-bound default shrinks.
    default_max_tokens: int = 256
    #: Abort a request when its client disconnects (vLLM does). False keeps generating for
    #: nobody, as behind a middle layer that does not pass the disconnect on.
    abort_on_disconnect: bool = True
    #: Hold the response headers until the first token (a middle layer waiting for upstream).
    headers_after_first_token: bool = False
    #: Injected faults, drawn in this order for every request.
    faults: tuple[Fault, ...] = ()
    #: Seed of the fault draws and of the generated text.
    seed: int = 0
    #: Seconds between points of the memory time series (:meth:`Simulator.memory_series`).
    series_interval_s: float = 0.05
    #: Most points the memory series keeps (oldest dropped first).
    series_max_points: int = 20000
    #: Largest request body accepted (413 above).
    max_body_bytes: int = 16 * 1024 * 1024
    #: Honour an ``x-sim-fault`` request header (comma-separated fault specs) that replaces
    #: ``faults`` for that one request: lets a test aim a fault at one request.
    fault_header: bool = True
    #: vLLM's ``--max-model-len``: a request whose prompt and ``max_tokens`` together pass it
    #: gets vLLM's 400 ("This model's maximum context length is ..."); without ``max_tokens`` it
    #: gets the context left after its prompt, at most ``default_max_tokens``. ``None``: only
    #: memory bounds a request (``/v1/models`` then reports ``memory_tokens``).
    max_model_len: int | None = None
    #: Refuse a partial answer to continue, with 400 and ``code: "invalid_prefill"``: a chat whose
    #: last message is the assistant's (``continue_final_message``), or a completion whose
    #: prompt is token ids. An engine (or hosted API) that cannot continue what another began.
    refuse_prefill: bool = False
    #: Read every request and answer nothing, on every route but ``/stats``, until the client
    #: leaves: an engine that accepts connections and is silent (the kernel accepts them while
    #: the process never answers). ``/stats`` still answers, so a test can see what reached it.
    black_hole: bool = False
    #: Healthy and failing periods on a schedule (see :class:`Flap`); ``None``: always healthy.
    flap: Flap | None = None
    #: Publish the KV memory in ``/metrics`` as vLLM publishes its cache configuration
    #: (``vllm:cache_config_info``, ``kv_cache_size_tokens`` = ``memory_tokens``), from which a
    #: gateway learns what the engine holds. False: an engine that does not say (an older vLLM,
    #: another OpenAI-compatible server), whose memory only ``--max-memory-tokens`` bounds.
    publish_kv_cache: bool = True

    def __post_init__(self) -> None:
        if self.memory_tokens < 1 or self.max_num_seqs < 1 or self.default_max_tokens < 1:
            raise ValueError("memory_tokens, max_num_seqs and default_max_tokens must be >= 1")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")
        if min(self.prefill_ms_per_token, self.itl_ms, self.itl_ms_per_seq) < 0:
            raise ValueError("timings must be >= 0")
        if not isinstance(self.faults, tuple):
            object.__setattr__(self, "faults", tuple(self.faults))

    def replace(self, **changes: object) -> SimConfig:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]
