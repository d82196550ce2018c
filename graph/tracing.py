"""OpenTelemetry traces of the loop: a span for the run, each node, each model call and
each tool call, with the session, persona, actor and round as attributes (the `[otel]` extra).

LangChain's callbacks are turned into spans by OpenInference's LangChain
instrumentor (`openinference-instrumentation-langchain`): one span per
LangChain run, so a turn is the graph's span, a span per node under it, and
under `call_model` the model call (kind LLM, its messages role by role) and
under `dispatch_tools` each tool call (kind TOOL). It was chosen over
OpenLLMetry's `opentelemetry-instrumentation-langchain`, which adds a second
span for the graph (`invoke_agent cyrene` over `cyrene.workflow`), names the
model `unknown` for a model without a provider package, and stores inputs as
LangChain's serialised constructors.

Every run carries its session's facts in its LangChain metadata
(`nodes.core.loop.Loop.trace_facts`, and `cyrene_round` on each model call), which
the instrumentor writes as one JSON `metadata` attribute. `SessionSpans`, a
span processor in front of the exporter, lifts them into attributes of their
own (`cyrene.session_id`, `cyrene.actor`, `cyrene.persona`, `cyrene.round`)
and, for a group or stranger session, drops every attribute and event that
could hold what someone said (inputs, outputs, messages, tool arguments,
exception text): a restricted session's words never leave the process. The
facts follow the thread through every door: a resume or a `Command` runs as
what its thread was opened as (`graph.runs`), and an `update_state` span carries
the thread's actor too (on a thread no turn has opened yet, `unbound`: stripped
as well, since whose words it holds is not known).

    provider = enable_tracing()          # OTLP/HTTP to $OTEL_EXPORTER_OTLP_ENDPOINT
    ...                                  # run turns
    provider.shutdown()                  # flush what is buffered
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Status

from nodes.core.env import RESTRICTED_ACTORS
from nodes.core.loop import TRACE_ACTOR, TRACE_PERSONA, TRACE_ROUND, TRACE_SESSION, UNBOUND_ACTOR
from nodes.kernel.extras import missing_extra

HIDDEN_ACTORS = RESTRICTED_ACTORS | {UNBOUND_ACTOR}
"""Sessions whose spans keep no text: group and stranger chats, and edits to a thread no
turn has opened."""

ATTRIBUTES = {
    TRACE_SESSION: "cyrene.session_id",
    TRACE_ACTOR: "cyrene.actor",
    TRACE_PERSONA: "cyrene.persona",
    TRACE_ROUND: "cyrene.round",
}
"""Run metadata key → the span attribute it becomes."""
SAFE_PREFIXES = (
    "cyrene.",
    "openinference.span.kind",
    "session.id",
    "llm.model_name",
    "llm.provider",
    "llm.system",
    "llm.token_count.",
    "tool.name",
    "tool.description",
)
"""What a restricted session's span keeps: names, ids and counts, never text."""


class SessionSpans(SpanProcessor):
    """Puts each span's session facts into attributes of their own, and keeps a restricted
    session's text out of every span, before `inner` (the exporting processor) sees it.

    Round: a model call's span has its own; every later span of the same trace (its node,
    the tools the model asked for, the stages after it, the run) has the round of the
    latest model call that ended before it.
    """

    def __init__(self, inner: SpanProcessor) -> None:
        self.inner = inner
        self._rounds: dict[int, int] = {}
        """trace id → the latest round a model call of that trace ended in."""

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.inner.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.inner.on_end(self._annotated(span))

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)

    def _annotated(self, span: ReadableSpan) -> ReadableSpan:
        attributes = dict(span.attributes or {})
        facts = _metadata(attributes)
        trace = span.context.trace_id if span.context else 0
        if isinstance(facts.get(TRACE_ROUND), int):
            self._rounds[trace] = facts[TRACE_ROUND]
        elif trace in self._rounds:
            facts[TRACE_ROUND] = self._rounds[trace]
        if span.parent is None:  # the run ends last: its trace is done
            self._rounds.pop(trace, None)
        attributes.update(
            {ATTRIBUTES[key]: value for key, value in facts.items() if key in ATTRIBUTES}
        )
        if facts.get(TRACE_ACTOR) not in HIDDEN_ACTORS:
            return _copy(span, attributes)
        kept = {k: v for k, v in attributes.items() if k.startswith(SAFE_PREFIXES)}
        return _copy(span, kept, restricted=True)


def _metadata(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """The run's LangChain metadata, as OpenInference stored it (a JSON string). Metadata
    that is not whole JSON (an attribute length limit cut it) names no actor that may be
    shown: the span keeps no text (fails closed)."""
    try:
        value = json.loads(str(attributes.get("metadata") or "{}"))
    except ValueError:
        return {TRACE_ACTOR: UNBOUND_ACTOR}
    return (
        {key: value[key] for key in ATTRIBUTES if key in value} if isinstance(value, dict) else {}
    )


def _copy(span: ReadableSpan, attributes: dict[str, Any], restricted: bool = False) -> ReadableSpan:
    """`span` with other attributes; restricted, its events keep only their names and
    exception types, and its status only its code."""
    events = span.events
    status = span.status
    if restricted:
        events = tuple(_bare(event) for event in span.events)
        status = Status(span.status.status_code)
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=attributes,
        events=events,
        links=span.links,
        kind=span.kind,
        status=status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def _bare(event: Any) -> Any:
    from opentelemetry.sdk.trace import Event

    kept = {k: v for k, v in (event.attributes or {}).items() if k == "exception.type"}
    return Event(event.name, kept, event.timestamp)


def enable_tracing(
    exporter: SpanExporter | None = None, provider: TracerProvider | None = None
) -> TracerProvider:
    """Trace every LangChain run in this process (the loop's among them) to `exporter`.

    Args:
        exporter: where spans go; default OTLP over HTTP to `$OTEL_EXPORTER_OTLP_ENDPOINT`
            (the SDK reads that and the other `OTEL_*` variables: headers, service name).
        provider: a tracer provider of your own to add the processor to (default: a new one).

    Returns:
        The provider; `shutdown()` it before the process ends, so buffered spans are sent.

    Example:
        >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
        ...     InMemorySpanExporter)
        >>> provider = enable_tracing(InMemorySpanExporter())
    """
    try:
        from openinference.instrumentation.langchain import LangChainInstrumentor

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
    except ImportError as exc:  # the SDK comes with chromadb; the instrumentor does not
        raise ImportError(missing_extra("otel", "tracing")) from exc
    provider = provider or TracerProvider()
    provider.add_span_processor(SessionSpans(BatchSpanProcessor(exporter)))
    instrumentor = LangChainInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()  # one provider at a time: the latest call wins
    instrumentor.instrument(tracer_provider=provider)
    return provider
