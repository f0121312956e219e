"""Conversations (`/ask` and `/v1/chat/completions` with a `conversation_id`): list, read, delete.
Reading is a read (MOERAG_READ_TOKEN where set; a scoped token reads its own only); forgetting one
is a write (the admin token)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from app.api.deps import AdminDep, Limit, Offset, ReaderDep, RuntimeDep, principal
from app.schemas.api import PAGE_DEFAULT, ConversationOut, ConversationSummary, Page, TurnOut
from app.services import conversations

router = APIRouter(prefix="/conversations", tags=["conversations"], dependencies=[ReaderDep])
ConversationPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")]


@router.get("", response_model=Page[ConversationSummary])
def list_conversations(
    rt: RuntimeDep, request: Request, offset: Offset = 0, limit: Limit = PAGE_DEFAULT
) -> Page[ConversationSummary]:
    """Conversations with their number of turns, the most recent first (a scoped token's own only)."""
    total, rows = conversations.conversation_page(rt.sessions, offset, limit, principal(request).owner)
    items = [ConversationSummary(id=cid, turns=n, last_at=at) for cid, n, at in rows]
    return Page(items=items, total=total, offset=offset, limit=limit)


@router.get("/{conversation_id}", response_model=ConversationOut)
def get_conversation(conversation_id: ConversationPath, request: Request, rt: RuntimeDep) -> ConversationOut:
    """Every turn: the question as asked and as routed, the answer, route and citations."""
    turns = conversations.turns(rt.sessions, conversation_id, principal(request).owner)
    return ConversationOut(id=conversation_id, turns=[TurnOut.model_validate(t) for t in turns])


@router.delete("/{conversation_id}", status_code=204, response_class=Response, dependencies=[AdminDep])
def delete_conversation(conversation_id: ConversationPath, rt: RuntimeDep) -> Response:
    """Forget the conversation's turns (the questions stay in the query log, as every question does)."""
    conversations.remove(rt.sessions, conversation_id)
    return Response(status_code=204)
