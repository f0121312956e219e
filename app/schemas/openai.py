"""Bodies of the OpenAI-compatible routes (`/v1/models`, `/v1/chat/completions`), as OpenAI names them.

Requests take what OpenAI's clients send: unknown fields are ignored (clients add new ones often),
the fields moerag cannot honour are refused by name (`n` above 1, `tools`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from app.schemas.api import CitationOut, ConversationId


class ContentPart(BaseModel):
    """A part of a message's content; only `text` parts are read (others, such as images, are refused)."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class Usage(BaseModel):
    """Tokens counted with the embedding model's tokenizer: the prompt (system prompt, question and
    passages the answer was written from) and the completion (the text returned)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(
        description='"moerag" routes as /ask does; "moerag/<slug>" or "moerag/expert-<id>" asks that expert '
        "(GET /v1/models)."
    )
    messages: list[ChatMessage] = Field(
        min_length=1,
        description="The last user message is the question; the earlier user messages are the conversation "
        "it follows up (made standalone as /ask does with a conversation_id).",
    )
    stream: StrictBool = False
    n: Literal[1] | None = Field(None, description="One answer a request: only 1.")
    tools: None = Field(None, description="Not supported: a knowledge base calls no tools.")
    conversation_id: ConversationId | None = Field(
        None, description="moerag's: a stored conversation (as on /ask); then only the last user message is read."
    )
    stream_options: StreamOptions | None = Field(
        None, description="With stream: include_usage sends a last chunk with the usage (no choices)."
    )


class Moerag(BaseModel):
    """moerag's extra field: what /ask answers beside the text (in a stream: the first chunk
    carries route and citations, the last one query_id and timings_ms)."""

    route: dict[str, Any] | None = None
    citations: list[CitationOut] | None = None
    query_id: int | None = None
    timings_ms: dict[str, float] | None = None
    conversation_id: str | None = None
    standalone_question: str | None = Field(None, description="The question as it was routed.")
    standalone_by: Literal["llm", "rule"] | None = Field(
        None, description="What rewrote the question (the configured model or the rule); null: routed as asked."
    )


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "moerag"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: Literal["stop"] = "stop"
    logprobs: None = None


class ChatCompletionOut(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    moerag: Moerag
