"""Conversations: the turns of each, stored in SQL; a follow-up made standalone from the last turn."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, delete, func, literal, select
from sqlalchemy.orm import Session, sessionmaker

from app.core.models import ConversationTurn
from app.core.paging import page
from engine.errors import NotFound
from engine.followup import HISTORY_TURNS, Complete, make_standalone
from engine.pipeline import Prepared


@dataclass(frozen=True)
class Turn:
    """A turn being answered: its conversation, the question as asked and as it is routed, and
    what made it standalone ("llm", "rule", or None: as asked)."""

    conversation_id: str
    question: str
    standalone: str
    standalone_by: str | None = None
    owner: str | None = None  # the scoped token asking it (None: an unscoped caller)


def begin(
    sessions: sessionmaker[Session],
    conversation_id: str,
    question: str,
    limit: int,
    complete: Complete | None = None,
    owner: str | None = None,
) -> Turn:
    """The next turn of `conversation_id` (a new id starts a conversation): `question` made
    standalone from the earlier turns (by the model `complete` when given, else by the rule).
    owner: a scoped token's name. Its conversations are its own: the same id under another owner
    is another conversation, never read here (no error either: nothing tells it that one exists)."""
    with sessions() as s:  # the rule reads the last turn's standalone question; a model also sees answers
        answer = ConversationTurn.answer if complete is not None else literal(None)
        rows = s.execute(
            select(ConversationTurn.standalone, answer)
            .where(ConversationTurn.conversation_id == conversation_id, _owned_by(owner))
            .order_by(ConversationTurn.id.desc())
            .limit(HISTORY_TURNS if complete is not None else 1)
        ).all()
    history = [(asked, answer) for asked, answer in reversed(rows)]
    text, by = make_standalone(question, history, limit, complete)
    return Turn(conversation_id, question, text, by, owner)


def record(
    sessions: sessionmaker[Session],
    turn: Turn,
    route: dict[str, Any],
    prepared: Prepared,
    answer: str | None,
    query_id: int | None,
) -> None:
    with sessions.begin() as s:
        s.add(
            ConversationTurn(
                conversation_id=turn.conversation_id,
                question=turn.question,
                standalone=turn.standalone,
                answer=answer,
                route=route,
                cited=[c.chunk.id for c in prepared.citations],
                query_id=query_id,
                owner=turn.owner,
            )
        )


def _owned_by(owner: str | None) -> ColumnElement[bool]:
    """The turns of `owner` (a scoped token's name), or of unscoped callers (None)."""
    return ConversationTurn.owner.is_(None) if owner is None else ConversationTurn.owner == owner


def turns(sessions: sessionmaker[Session], conversation_id: str, owner: str | None = None) -> list[ConversationTurn]:
    """The conversation's turns, oldest first; NotFound for an id with none (a scoped token's
    `owner`: its own turns only)."""
    with sessions() as s:
        stmt = select(ConversationTurn).where(ConversationTurn.conversation_id == conversation_id)
        if owner is not None:
            stmt = stmt.where(_owned_by(owner))
        rows = list(s.scalars(stmt.order_by(ConversationTurn.id)))
    if not rows:
        raise NotFound(f"conversation {conversation_id!r} not found")
    return rows


def conversation_page(
    sessions: sessionmaker[Session], offset: int, limit: int, owner: str | None = None
) -> tuple[int, list[tuple[str, int, datetime]]]:
    """(conversations in all, [(id, turns, last turn's time)]), the most recent first; a scoped
    token's `owner`: its own conversations only."""
    last = func.max(ConversationTurn.created_at)
    stmt = (
        select(ConversationTurn.conversation_id, func.count(ConversationTurn.id), last)
        .group_by(ConversationTurn.conversation_id)
        .order_by(last.desc(), ConversationTurn.conversation_id)
    )
    if owner is not None:
        stmt = stmt.where(_owned_by(owner))
    with sessions() as s:
        total, rows = page(s, stmt, offset, limit)
    return total, [(cid, int(n), at) for cid, n, at in rows]


def remove(sessions: sessionmaker[Session], conversation_id: str) -> int:
    """Delete the conversation's turns (their questions stay in the query log); NotFound if it has none."""
    with sessions.begin() as s:
        result = s.execute(delete(ConversationTurn).where(ConversationTurn.conversation_id == conversation_id))
        gone = cast(CursorResult[Any], result).rowcount
    if not gone:
        raise NotFound(f"conversation {conversation_id!r} not found")
    return int(gone)
