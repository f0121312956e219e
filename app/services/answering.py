"""One question answered as the API answers it (`POST /ask` and the CLI's local `ask`): checked,
routed and retrieved by the engine's pipeline, counted and logged."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.orm import Session, sessionmaker

from app.core.limits import check_question
from app.core.metrics import Metrics
from app.core.settings import Settings
from app.schemas.api import AskIn, AskOut, CitationOut
from app.services import conversations
from app.services.ask import log_question, route_json
from app.services.tokens import Principal, Tokens, reach
from app.serving.answer_cache import AnswerCache
from app.serving.generation import Generators
from engine.errors import ExpertNotFound, GeneratorFailed, GeneratorUnavailable, InvalidRequest
from engine.generators import GeneratorError, cited_numbers
from engine.pipeline import AskPipeline, AskRequest, Prepared
from engine.serving import ServingState


class AnswerParts(Protocol):
    """What answering a question takes of the service (app.runtime.Runtime is one): the settings
    and the database, the serving state, the pipeline and its answer cache, the generators (a
    conversation's rewriter) and the metrics."""

    @property
    def settings(self) -> Settings: ...

    @property
    def sessions(self) -> sessionmaker[Session]: ...

    @property
    def generators(self) -> Generators: ...

    @property
    def answers(self) -> AnswerCache: ...

    @property
    def pipeline(self) -> AskPipeline: ...

    @property
    def metrics(self) -> Metrics: ...

    @property
    def tokens(self) -> Tokens: ...

    def state(self) -> ServingState: ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens by the embedding model's tokenizer (the OpenAI API's `usage`)."""
        ...


def citations(p: Prepared, answer: str | None = None) -> list[CitationOut]:
    """The retrieved passages; `used` marks those the answer cites."""
    used = cited_numbers(answer) if answer else set()
    return [
        CitationOut(
            n=c.n,
            document_id=c.chunk.document_id,
            source=c.chunk.source,
            title=c.chunk.title,
            chunk_id=c.chunk.id,
            heading=c.chunk.heading,
            score=c.score,
            text=c.chunk.text,
            used=c.n in used,
        )
        for c in p.citations
    ]


@dataclass(frozen=True)
class Asked:
    """A question routed and retrieved; `turn`: the conversation turn it is, recorded by `finish`."""

    prepared: Prepared
    turn: conversations.Turn | None = None

    @property
    def standalone(self) -> str | None:
        """The question as routed, when a conversation made it standalone (else None)."""
        return self.turn.standalone if self.turn is not None else None

    @property
    def standalone_by(self) -> str | None:
        """What made it standalone: "llm", "rule", or None (as asked)."""
        return self.turn.standalone_by if self.turn is not None else None


def prepare(rt: AnswerParts, body: AskIn, who: Principal | None = None) -> Asked:
    """Check the question (made standalone in its conversation), then route and retrieve (or
    take a cached route and citations), within what `who` may read (app.services.tokens)."""
    check_question(body.query, body.k, rt.settings)
    if body.mode != "expert" and body.expert is not None:
        raise InvalidRequest("'expert' is only meaningful with mode='expert'")
    state = rt.state()  # one version for the whole question: checked, cached and routed in it
    allowed = reach(rt.tokens, who, state)
    if body.expert is not None and (
        body.expert not in state.experts or (allowed is not None and body.expert not in allowed.experts)
    ):
        raise ExpertNotFound(f"no expert {body.expert}")  # outside the scope: the same words, no oracle
    turn = None
    if body.conversation_id is not None:
        limit = rt.settings.max_question_chars
        complete = rt.generators.rewriter()
        owner = who.owner if who is not None else None  # a scoped token's own turns
        turn = conversations.begin(rt.sessions, body.conversation_id, body.query, limit, complete, owner)
    query = turn.standalone if turn is not None else body.query
    try:
        request = AskRequest(query, body.k, body.mode, body.expert, allowed)
        key = (query, body.k, body.mode, body.expert, allowed.key if allowed is not None else None)  # one a scope
        return Asked(rt.answers.prepare(key, state.serial, lambda: rt.pipeline.prepare(request, state)), turn)
    except GeneratorError as exc:
        raise GeneratorUnavailable(str(exc)) from None


def finish(rt: AnswerParts, asked: Asked, answer: str | None = None) -> int | None:
    """Count the answer, log the question and record its conversation turn; a full disk costs
    the log row, not the answer."""
    prepared = asked.prepared
    prepared.timings_ms.setdefault("generate", 0.0)
    prepared.timings_ms.setdefault("total", sum(v for k, v in prepared.timings_ms.items() if k != "total"))
    rt.metrics.observe(prepared.route, prepared.timings_ms)
    query_id = log_question(rt.sessions, prepared)
    if asked.turn is not None:
        route = route_json(prepared.route)
        kept = {"path": route["path"], "expert": route["expert"], "reason": route["reason"]}
        conversations.record(rt.sessions, asked.turn, kept, prepared, answer, query_id)
    return query_id


def answer_fields(asked: Asked, body: AskIn, answer: str | None = None) -> dict[str, Any]:
    """What both bodies of an answer carry, shaped once: the route, the citations (marked `used`
    once the answer is known) and, in a conversation, its id and the question as routed."""
    fields: dict[str, Any] = {
        "route": route_json(asked.prepared.route),
        "citations": citations(asked.prepared, answer),
    }
    if asked.turn is not None:
        fields |= {
            "conversation_id": body.conversation_id,
            "standalone_question": asked.standalone,
            "standalone_by": asked.standalone_by,
        }
    return fields


def answer_json(rt: AnswerParts, body: AskIn, who: Principal | None = None) -> bytes:
    """One answer as the API's JSON body (the CLI's local `ask` prints the same)."""
    asked = prepare(rt, body, who)
    prepared, answer = asked.prepared, None
    if body.generate:
        try:
            answer = "".join(prepared.answer_stream())
        except GeneratorError as exc:
            raise GeneratorFailed(str(exc)) from None
    query_id = finish(rt, asked, answer)
    out = AskOut(
        answer=answer,
        **answer_fields(asked, body, answer),
        timings_ms={k: round(v, 3) for k, v in prepared.timings_ms.items()},
        query_id=query_id,
    )
    return out.model_dump_json().encode()


def answer_events(asked: Asked, body: AskIn, log: Callable[..., int | None]) -> Iterator[tuple[str, dict[str, Any]]]:
    """One answer as the stream's events, (name, data): `route` (the fields `answer_fields` shapes),
    `token` ({"text"}) as the generator writes, `error` if it fails, `done` (timings, query id).
    `log(answer=...)` logs the question once, when the answer is whole."""
    fields = answer_fields(asked, body)
    fields["citations"] = [c.model_dump() for c in fields["citations"]]
    yield "route", fields
    text: list[str] = []
    if body.generate:
        try:
            for delta in asked.prepared.answer_stream():
                text.append(delta)
                yield "token", {"text": delta}
        except GeneratorError as exc:
            yield "error", {"code": GeneratorFailed.code, "message": str(exc)}
    query_id = log(answer="".join(text) if body.generate else None)
    yield "done", {"timings_ms": asked.prepared.timings_ms, "query_id": query_id}
