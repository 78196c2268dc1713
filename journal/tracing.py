"""OpenTelemetry tracing, strictly optional (issue 26).

Off unless :func:`enable` ran (``open_journal`` calls it when the ``tracing`` setting says so and
the ``opentelemetry-api`` package, extra ``tracing``, is there). While off, instrumented code
reads one module global (:data:`ON`) and does nothing else; nothing here imports OpenTelemetry.

The trace context of a write travels in its events' metadata columns when the write has no
metadata of its own: ``meta_ser_id`` 1 (JSON), ``meta_ser_manifest`` :data:`TRACE_MANIFEST`,
``meta_payload`` the W3C ``traceparent`` / ``tracestate`` as a JSON object. Readers of this
library see ``metadata=None`` (what was written) and the context through :func:`context_of`;
a JVM reader sees a small JSON object. A handler's span is a child of that context (one trace
from the command to the read model) and the batch span links to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .envelope import TRACE_MANIFEST, trace_payload

__all__ = ["ON", "TRACE_MANIFEST", "capture", "configure", "context_of", "disable", "enable", "span", "use"]

ON = False
"""True while spans are recorded (read by the hot paths before anything else)."""

_tracer: Any = None
_carried: dict[int, Any] = {}
"""id(write request) -> the span context of the persist that submitted it (for the batch's links)."""


def enable(tracer_provider: Any = None) -> None:
    """Record spans with ``tracer_provider`` (default: OpenTelemetry's global one)."""
    global ON, _tracer
    from opentelemetry import trace

    provider = tracer_provider or trace.get_tracer_provider()
    _tracer = provider.get_tracer("slice-journal")
    ON = True


def disable() -> None:
    global ON, _tracer
    ON, _tracer = False, None
    _carried.clear()


def configure(mode: str) -> None:
    """The ``tracing_mode`` setting: ``on``, ``off``, or ``auto`` (on when the API is installed and an
    SDK tracer provider is set when the journal opens)."""
    if mode == "off" or ON:
        return
    try:
        from opentelemetry import trace
    except ImportError:
        if mode == "on":
            from .errors import ConfigurationError

            needs = "tracing mode 'on' needs opentelemetry-api: pip install 'slice-journal[tracing]'"
            raise ConfigurationError(needs) from None
        return
    unset = type(trace.get_tracer_provider()).__name__ in ("ProxyTracerProvider", "NoOpTracerProvider")
    if mode == "on" or not unset:
        enable()


@contextlib.contextmanager
def span(
    name: str, *, parent: Any = None, links: Sequence[Any] = (), attributes: dict[str, Any] | None = None,
    kind: str = "INTERNAL",
) -> Iterator[Any]:  # fmt: skip
    """A span (current inside the block), child of ``parent`` (a Context) or of the current one."""
    from opentelemetry.trace import SpanKind

    with _tracer.start_as_current_span(
        name, context=parent, links=list(links), attributes=attributes, kind=SpanKind[kind]
    ) as s:
        yield s


def capture() -> Any:
    """The current context (to carry into another task), or None while tracing is off."""
    if not ON:
        return None
    from opentelemetry import context

    return context.get_current()


@contextlib.contextmanager
def use(ctx: Any) -> Iterator[None]:
    """Make a captured context current inside the block (nothing when ``ctx`` is None)."""
    if ctx is None:
        yield
        return
    from opentelemetry import context

    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def carrier() -> bytes:
    """The current context as a metadata payload (JSON of ``traceparent`` / ``tracestate``)."""
    import orjson
    from opentelemetry import propagate

    headers: dict[str, str] = {}
    propagate.inject(headers)
    return orjson.dumps(headers)


def note(request: object) -> None:
    """Remember the current span's context for the group-commit batch that writes ``request``."""
    from opentelemetry import trace

    _carried[id(request)] = trace.get_current_span().get_span_context()


def forget(request: object) -> None:
    _carried.pop(id(request), None)


def link_to(ctx_or_span: Any) -> Any:
    """A link to a span, or to the span of a Context."""
    from opentelemetry import trace
    from opentelemetry.trace import Link

    if isinstance(ctx_or_span, trace.Span):
        return Link(ctx_or_span.get_span_context())
    return Link(trace.get_current_span(ctx_or_span).get_span_context())


def links_of(requests: Sequence[object]) -> list[Any]:
    from opentelemetry.trace import Link

    return [Link(c) for c in (_carried.get(id(r)) for r in requests) if c is not None]


def context_of(envelope: Any) -> Any:
    """The trace context of the write that stored ``envelope`` (None: it carries none), from the
    journal's trace metadata or from a dict metadata with a ``traceparent`` key."""
    raw = trace_payload(envelope)
    if raw is None:
        meta = envelope.metadata
        if not (isinstance(meta, dict) and "traceparent" in meta):
            return None
        headers = {k: meta[k] for k in ("traceparent", "tracestate") if isinstance(meta.get(k), str)}
    else:
        import orjson

        try:
            headers = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    from opentelemetry import propagate, trace

    ctx = propagate.extract(headers)
    return ctx if trace.get_current_span(ctx).get_span_context().is_valid else None
