# Generated from _async.py by scripts/unasync.py: do not edit. Change _async.py (or the
# rules in the script) and run `make unasync`; `make lint` fails while the two differ.
"""The synchronous client: :class:`Client` and its :class:`Stream`.

``_async.py`` is the source: ``_sync.py`` is generated from it by ``scripts/unasync.py`` (run
``make unasync`` after a change; ``make lint`` fails while they differ). The few lines that
truly differ between the twins are written by hand in the two ``_*_support`` modules.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, overload
from urllib.parse import urlencode

import httpx2
import orjson

from streamsafe.client._answers import finished, is_event_stream, text_of
from streamsafe.client._call import MAX_ERROR_BODY, Call
from streamsafe.client._settings import NOT_GIVEN, Hook, Settings, make_settings, override
from streamsafe.client._sync_support import (
    GENERATOR_RUNNING,
    CloseAlias,
    Sleep,
    default_sleep,
    loop_over,
    wake_reader,
)
from streamsafe.client.errors import APIResponseError, StreamClosed, StreamError, StreamsafeError
from streamsafe.client.timeouts import Timeouts
from streamsafe.client.types import (
    APIObject,
    ChatCompletion,
    ChatCompletionChunk,
    Completion,
    CreateEmbeddingResponse,
    ModelList,
    Response,
    ResponseStreamEvent,
)
from streamsafe.retry import Outcome, RetryBudget, RetryPolicy, StreamingConfig, refusal_status
from streamsafe.sse import SSEDecoder, SSEError

__all__ = ["Client", "Stream"]

T = TypeVar("T", bound=APIObject)


class Stream(CloseAlias, Generic[T]):
    """A streaming result: iterate it with ``for``; use it with ``with`` or call
    :meth:`close` to drop the connection early (the server sees the disconnect). Leaving a
    loop over it early (``break``, an exception) closes it too; ``next(stream)`` reads
    one chunk without that.

    A break after the headers is resumed where the server is resumable, invisibly but for a log
    line; otherwise :class:`~streamsafe.client.errors.StreamInterrupted` is raised with what
    arrived. ``chunks`` holds every chunk received, ``text`` their text.
    """

    def __init__(
        self,
        response: httpx2.Response,
        chunk_type: type[T],
        *,
        call: Call,
        client: Client,
    ) -> None:
        self.response = response
        self.chunks: list[T] = []
        self._type = chunk_type
        self._call = call
        self._client = client
        self._closed = False  # the caller closed it (or a loop over it was left early)
        self._ended = False  # it was read to its end
        self._iterator = self._iter()

    @property
    def text(self) -> str:
        """The text of choice 0 received so far."""
        return text_of(self.chunks)

    @property
    def idempotency_key(self) -> str | None:
        """The key sent with every attempt and resume of this call."""
        return self._call.idempotency_key

    @property
    def resumes(self) -> int:
        """Resumes made so far."""
        return self._call.resumes

    def __iter__(self) -> Iterator[T]:
        if self._closed and not self._ended:
            raise _closed_error(self._call, self.chunks)
        return loop_over(self._iterator, self)

    def __next__(self) -> T:
        if self._closed and not self._ended:
            raise _closed_error(self._call, self.chunks)
        return self._iterator.__next__()

    def __enter__(self) -> Stream[T]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection now. Idempotent; safe while a close started by leaving a loop
        early is under way, and while another task reads the stream: its loop ends there,
        and the stream is never resumed after it."""
        self._closed = True
        try:
            self._iterator.close()
        except GENERATOR_RUNNING:
            # Another reader is inside it, maybe waiting for bytes: wake it; it sees the close
            # and its loop ends.
            wake_reader(self.response)
        self.response.close()

    def _iter(self) -> Generator[T, None]:
        call = self._call
        chunks = self.chunks
        make = self._type
        loads = orjson.loads
        response = self.response
        while True:
            decoder = SSEDecoder()
            # After a resume, skip any event the server replays that we already have.
            skip_through = _int_id(call.last_event_id) if call.resumes else None
            # What broke this attempt off: a refusal before any chunk, or the transport.
            broke: _Refused | httpx2.TransportError | None = None
            try:
                for raw in response.iter_bytes():
                    for ev in decoder.feed(raw):
                        if ev.is_done:
                            self._ended = True
                            return
                        if ev.id is not None:
                            if skip_through is not None:
                                n = _int_id(ev.id)
                                if n is not None and n <= skip_through:
                                    continue
                                skip_through = None
                            call.last_event_id = ev.id
                        try:
                            data = loads(ev.raw)
                        except orjson.JSONDecodeError:
                            raise call.bad_event(ev.raw, chunks) from None
                        if type(data) is not dict:
                            raise call.bad_event(ev.raw, chunks)
                        if "error" in data and data["error"] is not None:
                            raise _error_event(call, data, chunks)
                        chunk = make(data)
                        chunks.append(chunk)
                        yield chunk
                    if call.deadline_at is not None and call.past_deadline():
                        raise httpx2.ReadTimeout("total timeout")
                decoder.close()
                if finished(chunks):
                    self._ended = True
                    return
            except Exception as exc:
                if self._closed:
                    return  # closed by the caller, maybe from another task: the loop ends
                if isinstance(exc, (_Refused, httpx2.TransportError)):
                    broke = exc
                elif isinstance(exc, (SSEError, httpx2.DecodingError)):
                    raise call.unreadable_stream(exc, chunks) from exc
                else:
                    raise
            finally:
                response.close()
            if self._closed:
                return
            response = self._next_attempt(call, response, broke)
            self.response = response

    def _next_attempt(
        self,
        call: Call,
        response: httpx2.Response,
        broke: _Refused | httpx2.TransportError | None,
    ) -> httpx2.Response:
        """The response that carries the stream on after ``response`` broke off (``broke``:
        why, ``None`` where it ended before ``[DONE]``): a refusal before any chunk is retried,
        any other break resumed."""
        if isinstance(broke, _Refused):
            return self._client._retry_refused(call, broke, response.headers)
        outcome = call.stream_failure(broke, len(self.chunks))
        return self._client._resume(call, outcome, self.chunks, broke)


class _Refused(Exception):
    """A stream's first event, before any chunk, refused it (vLLM's load shedding answers 200,
    then an error carrying 503): nothing started."""

    def __init__(self, status: int, data: dict[str, Any]) -> None:
        super().__init__(status)
        self.status = status
        self.data = data


def _int_id(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _closed_error(call: Call, chunks: list[Any]) -> StreamClosed:
    return StreamClosed(
        f"the stream was closed after {len(chunks)} chunks, before its end",
        chunks=chunks,
        text=text_of(chunks),
        **call.kw(),
    )


def _error_event(call: Call, data: dict[str, Any], chunks: list[Any]) -> Exception:
    """What an error event in the stream raises: a refusal where it came before anything
    started (retried as its status would be), else the stream's error."""
    if not chunks and not call.resumes:
        status = refusal_status(data["error"])
        if status is not None:
            return _Refused(status, data)
    return call.stream_error(data, chunks)


class Client(CloseAlias):
    """A synchronous OpenAI-compatible client whose retries can never duplicate work.

    ``base_url`` falls back to ``OPENAI_BASE_URL``, then ``http://localhost:8000/v1``;
    ``api_key`` to ``OPENAI_API_KEY`` (no ``Authorization`` header without one).
    ``timeout``: a :class:`Timeouts` or a number of seconds for every phase but total.
    ``retry`` (default :class:`RetryPolicy()`) governs plain calls (``max_retries``,
    openai-python's spelling, sets its ``max_retries``), ``streaming`` (default
    :class:`StreamingConfig()`) streams; ``budget`` (default a fresh :class:`RetryBudget`,
    shared by every call of this client and its ``with_options`` copies; ``None`` disables)
    throttles retries while a backend keeps failing. ``on_retry`` / ``on_resume`` are called
    with a :class:`RetryEvent` before each wait. ``sleep``, ``clock`` and ``rand`` are
    ``time.sleep``, ``time.time`` and ``random.random`` unless given: tests pass a fake clock
    so retries wait no real time. ``http_client`` is used as is (and not closed by us).
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        max_retries: int | None = None,
        streaming: StreamingConfig | None = None,
        budget: RetryBudget | None = NOT_GIVEN,
        http_client: httpx2.Client | None = None,
        default_headers: Mapping[str, str] | None = None,
        on_retry: Hook | None = None,
        on_resume: Hook | None = None,
        sleep: Sleep | None = None,
        clock: Callable[[], float] | None = None,
        rand: Callable[[], float] | None = None,
    ) -> None:
        self._settings = make_settings(
            base_url=base_url,
            api_key=api_key,
            timeout=timeout,
            retry=retry,
            max_retries=max_retries,
            streaming=streaming,
            budget=budget,
            default_headers=default_headers,
            on_retry=on_retry,
            on_resume=on_resume,
            clock=clock,
            rand=rand,
        )
        self._owns_http = http_client is None
        # Timeouts go per request (see Call.timeout_extension), so the pool's own are off.
        self._http = http_client or httpx2.Client(timeout=None, follow_redirects=True)
        self._sleep = sleep or default_sleep
        self._attach_resources()

    def _attach_resources(self) -> None:
        """``client.chat``, ``.completions``, ... bound to this client (or a copy of it)."""
        self.chat = _Chat(self)
        self.completions = _Completions(self)
        self.embeddings = _Embeddings(self)
        self.responses = _Responses(self)
        self.models = _Models(self)

    @property
    def settings(self) -> Settings:
        """The settings in force (read-only)."""
        return self._settings

    @property
    def base_url(self) -> str:
        """Base URL, without a trailing slash."""
        return self._settings.base_url

    @property
    def budget(self) -> RetryBudget | None:
        """The retry budget shared by this client's calls."""
        return self._settings.budget

    def with_options(self, **changes: Any) -> Client:
        """A client with some settings changed (``base_url``, ``api_key``, ``timeout``, ``retry``,
        ``streaming``, ``budget``, ``default_headers``, ``on_retry``, ``on_resume``, ``clock``,
        ``rand``, ``sleep``, ``http_client``), sharing this one's connection pool and budget
        unless those are given. ``None`` keeps the current ``base_url``, ``api_key``, ``retry``,
        ``streaming`` and ``default_headers`` (as ``None`` per call does); ``budget=None`` turns
        throttling off and ``timeout=None`` lifts every limit. An unknown name raises
        :class:`TypeError`. Closing the copy never closes the shared pool."""
        other = object.__new__(Client)
        other.__dict__.update(self.__dict__)
        sleep = changes.pop("sleep", None)
        http_client: httpx2.Client | None = changes.pop("http_client", None)
        other._settings = override(self._settings, changes)
        other._owns_http = False
        if sleep is not None:
            other._sleep = sleep
        if http_client is not None:
            other._http = http_client
        other._attach_resources()
        return other

    @property
    def is_closed(self) -> bool:
        """True once the connection pool is closed: calls then raise, and streams still being
        read end with :class:`~streamsafe.client.errors.StreamInterrupted`, never resumed."""
        return self._http.is_closed

    def close(self) -> None:
        """Close the connection pool (if this client created it)."""
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the attempt loop ----------------------------------------------------------------

    def _send_once(
        self, call: Call, *, resume: bool
    ) -> tuple[httpx2.Response | None, Outcome | None, StreamsafeError | None]:
        """One request. Returns the committed 2xx response, or the outcome and error of a
        failed attempt (its response already closed)."""
        if self._http.is_closed:
            raise call.closed_client()
        ext = call.timeout_extension()
        try:
            request = self._http.build_request(
                call.method,
                call.url,
                content=call.body,
                headers=call.headers(resume=resume),
                extensions={"timeout": ext},
            )
        except httpx2.InvalidURL as exc:
            raise call.unusable_url(exc) from exc
        call.attempts += 1
        try:
            response = self._http.send(request, stream=True)
        except httpx2.UnsupportedProtocol as exc:
            raise call.unusable_url(exc) from exc
        except httpx2.TransportError as exc:
            outcome, err = call.request_failure(exc)
            return None, outcome, err
        except httpx2.RequestError as exc:  # too many redirects: no answer to use
            raise call.unusable_response(exc) from exc
        if response.status_code < 300:
            call.committed(response, ext)
            if call.stream and not is_event_stream(response):
                # Committed (the server may have done the work), so never re-sent: surface
                # what it said instead of an empty stream.
                try:
                    raw = _read_capped(response)
                except httpx2.RequestError:
                    raw = b""
                finally:
                    response.close()
                raise call.not_an_event_stream(response, raw)
            return response, None, None
        try:
            raw = _read_capped(response)
        except httpx2.RequestError:  # lost or undecodable: the status says enough
            raw = b""
        finally:
            response.close()
        outcome, err = call.status_failure(response, raw)
        return None, outcome, err

    def _open(self, call: Call) -> httpx2.Response:
        """Attempts until one commits (headers with 2xx), as the retry core decides."""
        while True:
            response, outcome, err = self._send_once(call, resume=False)
            if response is not None:
                return response
            assert outcome is not None and err is not None
            decision = call.decide(outcome)
            if not decision.retry:
                raise call.give_up_error(err)
            self._sleep(decision.delay)

    def _retry_refused(
        self, call: Call, refused: _Refused, headers: Mapping[str, str]
    ) -> httpx2.Response:
        """A stream refused by its first event: the uncommitted refusal of its status, retried
        as that status would be (``retry_if_nothing_started``), else its error raised."""
        outcome, err = call.refusal_failure(refused.status, refused.data, headers)
        decision = call.decide(outcome)
        if not decision.retry:
            raise call.give_up_error(err)
        self._sleep(decision.delay)
        return self._open(call)

    def _resume(
        self, call: Call, outcome: Outcome, chunks: list[Any], cause: BaseException | None
    ) -> httpx2.Response:
        """A committed stream broke: resume it (same key, Last-Event-ID) while the retry core
        says so, or raise StreamInterrupted with what arrived."""
        while True:
            if self._http.is_closed:
                raise call.closed_mid_stream(chunks) from cause
            decision = call.decide(outcome)
            if not decision.resume:
                raise call.interrupted(outcome, decision, chunks) from cause
            self._sleep(decision.delay)
            call.resumes += 1
            try:
                response, failed, err = self._send_once(call, resume=True)
            except (APIResponseError, StreamError) as exc:
                cause = exc
                outcome = Outcome.broken(
                    events=len(chunks), resumable=False, detail=f"resume answered: {exc}"
                )
                continue
            if response is not None:
                if call.resumable:
                    return response
                response.close()  # answered, but cannot replay: do not guess
                cause = None
                outcome = Outcome.broken(
                    events=len(chunks), resumable=False, detail="resume answered without replay"
                )
                continue
            assert failed is not None
            cause = err
            # A resume that fails before its headers is one more break: resumable while the
            # server may yet answer (unreachable, overloaded), not after a 4xx refusal.
            transient = failed.kind != "status" or failed.spends_budget
            outcome = Outcome.broken(
                events=len(chunks),
                resumable=transient,
                detail=f"resume failed: {failed.describe()}",
            )

    def _request(self, call: Call, result: type[T]) -> T:
        response = self._open(call)
        try:
            raw = response.read()
        except httpx2.TransportError as exc:
            call.decide(call.stream_failure(exc, 0))  # committed: logged, never re-sent
            raise call.body_failure(exc) from exc
        except httpx2.DecodingError as exc:
            raise call.unusable_response(exc) from exc
        finally:
            response.close()
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise APIResponseError(
                f"response is not JSON: {raw[:200]!r}",
                body=raw[:MAX_ERROR_BODY].decode("utf-8", "replace"),
                **call.kw(),
            ) from None
        if type(data) is not dict:
            raise APIResponseError(
                f"response is not a JSON object: {raw[:200]!r}", body=data, **call.kw()
            )
        if data.get("error") is not None:
            headers = {k.lower(): v for k, v in response.headers.items()}
            raise call.error_answer(data, headers)
        return result(data)

    def _post(
        self,
        path: str,
        body: dict[str, Any],
        options: dict[str, Any],
        result: type[T],
        stream: bool,
    ) -> Any:
        key = options.pop("idempotency_key", None)
        settings = override(self._settings, options)
        call = Call(settings, "POST", path, body, stream=stream, idempotency_key=key)
        if not stream:
            return self._request(call, result)
        return Stream(self._open(call), result, call=call, client=self)


def _read_capped(response: httpx2.Response) -> bytes:
    buf = bytearray()
    for part in response.iter_bytes():
        buf += part
        if len(buf) >= MAX_ERROR_BODY:
            break
    return bytes(buf[:MAX_ERROR_BODY])


def _body(base: dict[str, Any], params: dict[str, Any], extra_body: Any) -> dict[str, Any]:
    body = {**base, **{k: v for k, v in params.items() if v is not NOT_GIVEN}}
    if extra_body:
        body.update(extra_body)
    return body


def _with_query(path: str, extra_query: Mapping[str, Any] | None) -> str:
    """``path`` with openai-python's ``extra_query`` as its query string."""
    return f"{path}?{urlencode(extra_query, doseq=True)}" if extra_query else path


def _options(
    timeout: Any, retry: Any, streaming: Any, extra_headers: Any, idempotency_key: Any
) -> dict[str, Any]:
    return {
        "timeout": timeout,
        "retry": retry if retry is not None else NOT_GIVEN,
        "streaming": streaming if streaming is not None else NOT_GIVEN,
        "default_headers": extra_headers if extra_headers else NOT_GIVEN,
        "idempotency_key": idempotency_key,
    }


class _ChatCompletions:
    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def create(
        self, *, model: str, messages: list[dict[str, Any]], stream: Literal[True], **kw: Any
    ) -> Stream[ChatCompletionChunk]: ...
    @overload
    def create(
        self, *, model: str, messages: list[dict[str, Any]], stream: Literal[False] = ..., **kw: Any
    ) -> ChatCompletion: ...
    @overload
    def create(
        self, *, model: str, messages: list[dict[str, Any]], stream: bool, **kw: Any
    ) -> ChatCompletion | Stream[ChatCompletionChunk]: ...

    def create(
        self,
        *,
        model: str,
        messages: list[dict[str, Any]],
        stream: bool = False,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        streaming: StreamingConfig | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> ChatCompletion | Stream[ChatCompletionChunk]:
        """``POST /chat/completions``. ``params`` go into the body as given (``max_tokens``,
        ``temperature``, ...); ``timeout``, ``retry``, ``streaming``, ``extra_headers`` apply to
        this call only; ``idempotency_key`` replaces the generated one."""
        body = _body({"model": model, "messages": messages}, params, extra_body)
        if stream:
            body["stream"] = True
        opts = _options(timeout, retry, streaming, extra_headers, idempotency_key)
        cls = ChatCompletionChunk if stream else ChatCompletion
        path = _with_query("/chat/completions", extra_query)
        return self._client._post(path, body, opts, cls, stream)  # type: ignore[no-any-return]


class _Chat:
    def __init__(self, client: Client) -> None:
        self.completions = _ChatCompletions(client)


class _Completions:
    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def create(
        self, *, model: str, prompt: Any, stream: Literal[True], **kw: Any
    ) -> Stream[Completion]: ...
    @overload
    def create(
        self, *, model: str, prompt: Any, stream: Literal[False] = ..., **kw: Any
    ) -> Completion: ...
    @overload
    def create(
        self, *, model: str, prompt: Any, stream: bool, **kw: Any
    ) -> Completion | Stream[Completion]: ...

    def create(
        self,
        *,
        model: str,
        prompt: Any,
        stream: bool = False,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        streaming: StreamingConfig | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> Completion | Stream[Completion]:
        """``POST /completions`` (legacy text completion); options as for chat."""
        body = _body({"model": model, "prompt": prompt}, params, extra_body)
        if stream:
            body["stream"] = True
        opts = _options(timeout, retry, streaming, extra_headers, idempotency_key)
        path = _with_query("/completions", extra_query)
        return self._client._post(path, body, opts, Completion, stream)  # type: ignore[no-any-return]


class _Embeddings:
    def __init__(self, client: Client) -> None:
        self._client = client

    def create(
        self,
        *,
        model: str,
        input: Any,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> CreateEmbeddingResponse:
        """``POST /embeddings``: ``input`` is a string, a list of strings or of token ids;
        ``params`` (``encoding_format``, ``dimensions``, ``user``, ...) go into the body as
        given. A plain call: it follows the retry policy, with one Idempotency-Key."""
        body = _body({"model": model, "input": input}, params, extra_body)
        opts = _options(timeout, retry, None, extra_headers, idempotency_key)
        path = _with_query("/embeddings", extra_query)
        return self._client._post(path, body, opts, CreateEmbeddingResponse, False)  # type: ignore[no-any-return]


class _Responses:
    def __init__(self, client: Client) -> None:
        self._client = client

    @overload
    def create(
        self, *, model: str, input: Any, stream: Literal[True], **kw: Any
    ) -> Stream[ResponseStreamEvent]: ...
    @overload
    def create(
        self, *, model: str, input: Any, stream: Literal[False] = ..., **kw: Any
    ) -> Response: ...
    @overload
    def create(
        self, *, model: str, input: Any, stream: bool, **kw: Any
    ) -> Response | Stream[ResponseStreamEvent]: ...

    def create(
        self,
        *,
        model: str,
        input: Any,
        stream: bool = False,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
        streaming: StreamingConfig | None = None,
        extra_headers: Mapping[str, str] | None = None,
        extra_body: Mapping[str, Any] | None = None,
        extra_query: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        **params: Any,
    ) -> Response | Stream[ResponseStreamEvent]:
        """``POST /responses`` (the Responses API): ``input`` is a string or a list of input
        items; ``params`` (``instructions``, ``max_output_tokens``, ``store``, ...) go into the
        body as given; options as for chat. A stream yields :class:`ResponseStreamEvent` and
        ends with ``response.completed`` (or ``.incomplete``, ``.failed``): the Responses API
        sends no ``[DONE]``."""
        body = _body({"model": model, "input": input}, params, extra_body)
        if stream:
            body["stream"] = True
        opts = _options(timeout, retry, streaming, extra_headers, idempotency_key)
        cls = ResponseStreamEvent if stream else Response
        path = _with_query("/responses", extra_query)
        return self._client._post(path, body, opts, cls, stream)  # type: ignore[no-any-return]


class _Models:
    def __init__(self, client: Client) -> None:
        self._client = client

    def list(
        self,
        *,
        timeout: Timeouts | float | None = NOT_GIVEN,
        retry: RetryPolicy | None = None,
    ) -> ModelList:
        """``GET /models``: idempotent, so it follows the retry policy like any plain call."""
        settings = override(
            self._client._settings,
            {"timeout": timeout, "retry": retry if retry is not None else NOT_GIVEN},
        )
        return self._client._request(
            Call(settings, "GET", "/models", None, stream=False), ModelList
        )
