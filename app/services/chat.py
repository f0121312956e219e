"""The OpenAI chat-completions use case: the knowledge base is the model.

`moerag` routes as `/ask` does; `moerag/<slug>` or `moerag/expert-<id>` asks that expert
(mode=expert): the slug is its name's (engine.topics.slug), and a renamed expert keeps answering to
its old slugs, so a client that saved a model id keeps working. The last
user message is the question. The answer's text ends with its numbered sources; citations, route,
query id and timings travel in the extra field `moerag`, as `/ask` returns them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from app.schemas.api import AskIn, CitationOut
from app.schemas.openai import (
    AssistantMessage,
    ChatCompletionOut,
    ChatIn,
    Choice,
    ModelList,
    ModelOut,
    Moerag,
    Usage,
)
from app.services.answering import AnswerParts, Asked, citations, finish, prepare
from app.services.ask import route_json
from app.services.tokens import Principal, reach
from engine import chat_tasks
from engine.errors import GeneratorFailed, InvalidRequest, ModelNotFound
from engine.followup import make_standalone, standalone_chain
from engine.generators import GeneratorError
from engine.serving import ExpertProfile


class LogAnswer(Protocol):
    """Logs the question once, with the answer streamed (app.api.routes.flow.LogOnce)."""

    def __call__(self, aborted: bool = False, answer: str | None = None) -> int | None: ...


MODEL = "moerag"
EXPERT_MODEL = MODEL + "/"  # + an expert's slug, or expert-<id>
_LISTED_SINCE = int(time.time())  # the models' `created`


def visible(rt: AnswerParts, who: Principal | None) -> Mapping[int, ExpertProfile]:
    """The experts `who` may see (a scoped token: those in its scope; else all)."""
    state = rt.state()
    allowed = reach(rt.tokens, who, state)
    return {i: e for i, e in state.experts.items() if allowed is None or i in allowed.experts}


def models(rt: AnswerParts, who: Principal | None = None) -> ModelList:
    """`moerag`, then per expert (those `who` may see) in id order `moerag/<slug>` and `moerag/expert-<id>`."""
    names = [MODEL]
    for i, p in sorted(visible(rt, who).items()):
        names += [EXPERT_MODEL + p.slugs[0]] if p.slugs else []
        names.append(f"{EXPERT_MODEL}expert-{i}")
    return ModelList(data=[ModelOut(id=name, created=_LISTED_SINCE) for name in names])


def model(rt: AnswerParts, model_id: str, who: Principal | None = None) -> ModelOut:
    """One model by any id it answers to (`model_ids`), or ModelNotFound (an expert `who` may not see too)."""
    if model_id not in model_ids(visible(rt, who)):
        raise ModelNotFound(f"the model {model_id!r} does not exist; GET /v1/models lists them")
    return ModelOut(id=model_id, created=_LISTED_SINCE)


def model_ids(experts: Mapping[int, ExpertProfile]) -> dict[str, int | None]:
    """Every model id that answers: {id: its expert, None for `moerag`}; an expert's current and
    old slugs, its `expert-<id>`, and its name as it is now."""
    out: dict[str, int | None] = {}
    for i, p in sorted(experts.items(), reverse=True):  # the lower id wins a shared old slug
        out |= {EXPERT_MODEL + name: i for name in (*p.slugs[1:], p.name, *p.slugs[:1], f"expert-{i}")}
    return out | {MODEL: None}


@dataclass(frozen=True)
class ChatAsked:
    """A chat request routed and retrieved: the /ask request it stands for, and what made its
    question standalone ("llm", "rule", or None)."""

    ask: AskIn
    asked: Asked
    standalone_by: str | None

    @property
    def standalone(self) -> str:
        return self.asked.standalone or self.ask.query


def prepare_chat(rt: AnswerParts, body: ChatIn, who: Principal | None = None) -> ChatAsked:
    """`ask_body`, then `prepare` (both may wait on a model: run off the event loop), within what `who` may read."""
    ask, by = ask_body(rt, body, who)
    asked = prepare(rt, ask, who)
    return ChatAsked(ask, asked, asked.standalone_by if ask.conversation_id is not None else by)


def ask_body(rt: AnswerParts, body: ChatIn, who: Principal | None = None) -> tuple[AskIn, str | None]:
    """The /ask request a chat request stands for (its model's mode and expert, and its question),
    and what made the question standalone.

    The question: with a `conversation_id`, the last user message (made standalone from the stored
    turns); without one, the last user message made standalone from the messages before it
    (engine.followup: by the configured model, else the rule applied to each user message in turn)."""
    by_model = model_ids(visible(rt, who))
    if body.model not in by_model:
        raise ModelNotFound(f"the model {body.model!r} does not exist; GET /v1/models lists them")
    expert = by_model[body.model]
    mode = "auto" if expert is None else "expert"
    questions = _questions(body)
    if body.conversation_id is not None:
        return AskIn(query=questions[-1], mode=mode, expert=expert, conversation_id=body.conversation_id), None
    limit = rt.settings.max_question_chars
    previous = standalone_chain(questions[:-1], limit) or None
    query, by = make_standalone(questions[-1], _history(body, questions), limit, rt.generators.rewriter(), previous)
    return AskIn(query=query, mode=mode, expert=expert), by


def _history(body: ChatIn, questions: list[str]) -> list[tuple[str, str | None]]:
    """(user message, the assistant's reply to it or None) for every user message but the last."""
    replies: list[str | None] = []
    for m in body.messages:
        if m.role == "user":
            replies.append(None)
        elif m.role == "assistant" and replies and isinstance(m.content, str):
            replies[-1] = m.content
    return list(zip(questions[:-1], replies[:-1], strict=True))


def _questions(body: ChatIn) -> list[str]:
    """The text of every user message, oldest first."""
    texts = []
    for m in body.messages:
        if m.role != "user":
            continue
        content = m.content
        if isinstance(content, list):
            if any(part.type != "text" for part in content):
                raise InvalidRequest("only text content parts are read")
            content = "\n".join(part.text or "" for part in content)
        texts.append(content or "")
    if not texts:
        raise InvalidRequest("the messages hold no user message: the last one is the question")
    if not texts[-1].strip():
        raise InvalidRequest("the last user message is empty")
    return texts


def sources(cited: list[CitationOut]) -> str:
    """The numbered sources appended to an answer's text ('' without passages)."""
    lines = [f"[{c.n}] {c.title or c.source} ({c.source})" for c in cited]
    return "\n\nSources:\n" + "\n".join(lines) if lines else ""


def usage(rt: AnswerParts, prompt: Sequence[str], completion: str) -> Usage:
    """The request's tokens, by the embedding model's tokenizer: the texts the answer was written
    from (`prompt`) and the text returned."""
    asked, answered = sum(rt.count_tokens(list(prompt))), sum(rt.count_tokens([completion]))
    return Usage(prompt_tokens=asked, completion_tokens=answered, total_tokens=asked + answered)


def prompt_texts(prepared: Any) -> list[str]:
    """What the generator reads: its system prompt, the question and the passages."""
    return [prepared.system_prompt, prepared.question, *(c.chunk.text for c in prepared.citations)]


# ---- a chat UI's own task prompts (engine.chat_tasks) ---------------------------------------------


def ui_task(body: ChatIn) -> str | None:
    """The task a chat UI's own prompt asks for (its title, tags, follow-ups...), or None for a question."""
    last = next((m for m in reversed(body.messages) if m.role == "user"), None)
    return chat_tasks.task_of(last.content) if last is not None and isinstance(last.content, str) else None


def task_answer(rt: AnswerParts, body: ChatIn, task: str) -> str:
    """A chat UI's task, answered without retrieval: by the configured model when there is one
    (`Generators.task_model`), else briefly from the chat history (engine.chat_tasks)."""
    prompt = str(next(m.content for m in reversed(body.messages) if m.role == "user"))
    complete = rt.generators.task_model()
    if complete is not None:
        messages = [{"role": m.role, "content": m.content} for m in body.messages if isinstance(m.content, str)]
        try:
            return complete(messages)
        except GeneratorError as exc:
            raise GeneratorFailed(str(exc)) from None
    return chat_tasks.brief_answer(task, prompt)


def task_completion(rt: AnswerParts, body: ChatIn, task: str) -> tuple[bytes | None, list[str] | None]:
    """A task's completion: (its JSON body, None), or with stream (None, its server-sent events).
    Not a question: nothing is retrieved or logged; `moerag.route` says so."""
    text = task_answer(rt, body, task)
    route = {"path": "none", "reason": "chat_ui_task", "task": task}
    prompt = [str(m.content) for m in body.messages if isinstance(m.content, str)]
    counted = usage(rt, prompt, text)
    if not body.stream:
        out = ChatCompletionOut(
            id=_completion_id(),
            created=int(time.time()),
            model=body.model,
            choices=[Choice(message=AssistantMessage(content=text))],
            usage=counted,
            moerag=Moerag(route=route),
        )
        return out.model_dump_json().encode(), None
    chunk = _chunker(body.model, body.stream_options is not None and body.stream_options.include_usage)
    events = [chunk({"role": "assistant", "content": ""}, moerag={"route": route}), chunk({"content": text})]
    events.append(chunk({}, "stop"))
    if body.stream_options is not None and body.stream_options.include_usage:
        events.append(chunk(None, usage=counted.model_dump()))
    return None, [*events, "data: [DONE]\n\n"]


def completion_json(rt: AnswerParts, body: ChatIn, who: Principal | None = None) -> bytes:
    """One non-streamed completion, serialised (the route returns the bytes as they are)."""
    chat = prepare_chat(rt, body, who)
    asked = chat.asked
    prepared = asked.prepared
    try:
        answer = "".join(prepared.answer_stream())
    except GeneratorError as exc:
        raise GeneratorFailed(str(exc)) from None
    query_id = finish(rt, asked, answer)
    cited = citations(prepared, answer)
    content = answer + sources(cited)
    out = ChatCompletionOut(
        id=_completion_id(),
        created=int(time.time()),
        model=body.model,
        choices=[Choice(message=AssistantMessage(content=content))],
        usage=usage(rt, prompt_texts(prepared), content),
        moerag=Moerag(
            route=route_json(prepared.route),
            citations=cited,
            query_id=query_id,
            timings_ms={k: round(v, 3) for k, v in prepared.timings_ms.items()},
            conversation_id=body.conversation_id,
            standalone_question=chat.standalone,
            standalone_by=chat.standalone_by,
        ),
    )
    return out.model_dump_json().encode()


def _chunker(model: str, with_usage: bool) -> Callable[..., str]:
    """chunk(delta, finish_reason=None, **extra) -> one `data: <chat.completion.chunk>` line of a
    stream; delta None: the usage chunk (no choices). With `with_usage` (stream_options
    include_usage) every other chunk says `usage: null`, as OpenAI's do."""
    ident, created = _completion_id(), int(time.time())

    def chunk(delta: dict[str, Any] | None, finish_reason: str | None = None, **extra: Any) -> str:
        choices = (
            [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
        )
        body = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model, "choices": choices}
        if with_usage:
            body["usage"] = None
        return f"data: {json.dumps(body | extra)}\n\n"

    return chunk


def stream_chunks(
    rt: AnswerParts, chat: ChatAsked, model: str, log: LogAnswer, with_usage: bool = False
) -> Iterator[str]:
    """OpenAI's stream: `data: <chat.completion.chunk>` lines, then `data: [DONE]`. The first chunk
    (role) carries route and citations; the text comes as deltas, then the sources; the last chunk
    (finish_reason "stop") carries query_id and timings; with `with_usage` a usage chunk follows
    (no choices). A generator failure is an `error` event."""
    chunk = _chunker(model, with_usage)
    prepared, text = chat.asked.prepared, []
    cited = citations(prepared)
    route = {
        "route": route_json(prepared.route),
        "citations": [c.model_dump() for c in cited],
        "conversation_id": chat.ask.conversation_id,
        "standalone_question": chat.standalone,
        "standalone_by": chat.standalone_by,
    }
    yield chunk({"role": "assistant", "content": ""}, moerag=route)
    try:
        for delta in prepared.answer_stream():
            text.append(delta)
            yield chunk({"content": delta})
    except GeneratorError as exc:
        log(answer="".join(text))
        error = {"message": str(exc), "type": "server_error", "param": None, "code": "generator_failed"}
        yield f"data: {json.dumps({'error': error})}\n\n"
        return
    if tail := sources(cited):
        yield chunk({"content": tail})
    query_id = log(answer="".join(text))
    yield chunk({}, "stop", moerag={"query_id": query_id, "timings_ms": prepared.timings_ms})
    if with_usage:
        yield chunk(None, usage=usage(rt, prompt_texts(prepared), "".join(text) + tail).model_dump())
    yield "data: [DONE]\n\n"


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
