"""OpenTelemetry tracing, optional (``pip install 'streamsafe[otel]'``, ``streamsafe serve
--otel``, or ``GatewayConfig(tracing=True)`` with a tracer provider of the program's own).

Three kinds of span, none per chunk:

- one per request (``SERVER``), a child of the client's ``traceparent`` where it sent one, with
  the access line's facts: status, outcome, how it joined its generation, the generation, the
  requests its generation sent upstream and their bound;
- one per generation (``INTERNAL``), a child of the request that started it (a request that
  attaches to it, replays or resumes it links to it instead), ended with its final state,
  attempts, continuations and engine;
- one per upstream attempt (``CLIENT``), a child of its generation, naming the engine, whether
  it continues a broken stream, and how it ended; its ``traceparent`` goes upstream with the
  request, so a Llama Stack or vLLM that traces joins the same trace.

Only the OpenTelemetry API is used here: the provider (the SDK, its exporter) is the program's
(:func:`setup_otlp` for ``streamsafe serve --otel``). With tracing off, or the API missing, every
call is a cheap no-op on ``None``.
"""

from __future__ import annotations

import os
from typing import Any

from streamsafe.server.asgi import Scope

__all__ = ["GenerationTrace", "Tracing", "TracingUnavailable", "setup_otlp"]

_NAME = "streamsafe.gateway"


#: The access line's fields a request's span carries too (``streamsafe.<name>``): who asked, how
#: it was served, and what it cost the engines (``asks``, ``asked``, ``asks_bound``).
_REQUEST_FACTS = (
    "tenant",
    "outcome",
    "joined",
    "generation",
    "attempts",
    "asks",
    "asked",
    "asks_bound",
    "engine",
)


class TracingUnavailable(RuntimeError):
    """Tracing was asked for but OpenTelemetry is not installed."""


class GenerationTrace:
    """A generation's span and the ``traceparent`` header line of its current attempt."""

    __slots__ = ("header", "span")

    def __init__(self, span: Any) -> None:
        self.span = span
        #: ``traceparent: ...\\r\\n`` (and ``tracestate``) of the attempt under way, as header
        #: lines for the upstream request; empty between attempts.
        self.header = b""


class Tracing:
    """The gateway's spans (see the module); ``enabled`` False makes every method a no-op."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._trace: Any = None
        self._propagate: Any = None
        if not enabled:
            return
        try:
            from opentelemetry import propagate, trace
        except ImportError as exc:  # pragma: no cover - the extra is not installed
            msg = "tracing needs OpenTelemetry: pip install 'streamsafe[otel]'"
            raise TracingUnavailable(msg) from exc
        self._trace = trace
        self._propagate = propagate
        self._tracer = trace.get_tracer(_NAME)

    # -- requests -------------------------------------------------------------------------------

    def request(self, scope: Scope, method: str, path: str) -> Any:
        """The span of one request, a child of the client's ``traceparent`` where it sent one
        (``None`` with tracing off)."""
        if self._trace is None:
            return None
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", ())
            if k in (b"traceparent", b"tracestate")
        }
        parent = self._propagate.extract(carrier) if carrier else None
        return self._tracer.start_span(
            f"{method} {path}",
            context=parent,
            kind=self._trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        )

    def end_request(self, span: Any, fields: dict[str, Any]) -> None:
        """End a request's span with its access line's ``fields``."""
        if span is None:
            return
        status = fields.get("status")
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        for key in _REQUEST_FACTS:
            value = fields.get(key)
            if value is not None:
                span.set_attribute(f"streamsafe.{key}", value)
        if status is not None and status >= 500:
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    # -- generations ----------------------------------------------------------------------------

    def generation(self, gen_id: str, parent: Any = None) -> GenerationTrace | None:
        """A generation's trace, its span a child of ``parent`` (the request that started it;
        ``None``: a root, as for one taken over from another replica)."""
        if self._trace is None:
            return None
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        span = self._tracer.start_span(
            "generation",
            context=context,
            kind=self._trace.SpanKind.INTERNAL,
            attributes={"streamsafe.generation": gen_id},
        )
        return GenerationTrace(span)

    def link(self, request_span: Any, gen_trace: GenerationTrace | None) -> None:
        """A request joined a generation another request started: say so on its span."""
        if request_span is None or gen_trace is None:
            return
        if hasattr(request_span, "add_link"):
            request_span.add_link(gen_trace.span.get_span_context())

    def end_generation(self, gen_trace: GenerationTrace | None, facts: dict[str, Any]) -> None:
        """End a generation's span with ``facts`` (state, attempts, continuations, engine)."""
        if gen_trace is None:
            return
        span = gen_trace.span
        for key, value in facts.items():
            if value is not None:
                span.set_attribute(f"streamsafe.{key}", value)
        if facts.get("state") == "failed":
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR))
        span.end()

    # -- upstream attempts ----------------------------------------------------------------------

    def attempt(self, gen_trace: GenerationTrace | None, number: int, continuing: bool) -> Any:
        """The span of an upstream attempt, a child of its generation's; its ``traceparent``
        is put in ``gen_trace.header`` for the upstream request."""
        if self._trace is None or gen_trace is None:
            return None
        context = self._trace.set_span_in_context(gen_trace.span)
        span = self._tracer.start_span(
            "upstream attempt",
            context=context,
            kind=self._trace.SpanKind.CLIENT,
            attributes={"streamsafe.attempt": number, "streamsafe.continuation": continuing},
        )
        carrier: dict[str, str] = {}
        self._propagate.inject(carrier, context=self._trace.set_span_in_context(span))
        gen_trace.header = "".join(f"{k}: {v}\r\n" for k, v in carrier.items()).encode("latin-1")
        return span

    def end_attempt(
        self,
        span: Any,
        gen_trace: GenerationTrace | None,
        engine: str | None,
        status: int | None,
        broke: str | None,
    ) -> None:
        """End an attempt's span: the ``engine`` it went to, the upstream's ``status``, and why
        it ``broke`` where another attempt follows."""
        if gen_trace is not None:
            gen_trace.header = b""
        if span is None:
            return
        if engine is not None:
            span.set_attribute("server.address", engine)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if broke is not None:
            span.set_attribute("streamsafe.broke", broke)
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, broke))
        span.end()


def setup_otlp(service_name: str = "streamsafe-gateway") -> None:
    """Install the OpenTelemetry SDK as this process's tracer provider, exporting spans in
    batches over OTLP/HTTP to ``$OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporter's default,
    ``http://localhost:4318``); ``$OTEL_SERVICE_NAME`` names the service where set. Raises
    :class:`TracingUnavailable` without the ``otel`` extra."""
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        msg = "--otel needs OpenTelemetry's SDK and OTLP exporter: pip install 'streamsafe[otel]'"
        raise TracingUnavailable(msg) from exc
    name = os.environ.get("OTEL_SERVICE_NAME", service_name)
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
