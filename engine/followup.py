"""A follow-up question made standalone before it is routed ("and how do I undo that?").

The rule, without a language model: a question that opens with a connective ("and", "but",
"also", "so", "then", "what about", "how about", "what if", "why not"), refers back ("it",
"that", "this", "these", "those", "they", "them"), or has at most three words is
read as a follow-up and prefixed with the conversation's previous standalone question; any
other question stands alone. The prefix is cut from its start to keep the result within
`limit` characters. Routing and retrieval then see the topic the follow-up leaves implicit.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_OPENS = re.compile(r"^\s*(and|but|also|so|then|what about|how about|what if|why not)\b", re.IGNORECASE)
_REFERS_BACK = re.compile(r"\b(it|that|this|these|those|they|them)\b", re.IGNORECASE)
SHORT = 3  # words: a question this short is a follow-up


def is_follow_up(question: str) -> bool:
    return bool(_OPENS.match(question) or _REFERS_BACK.search(question)) or len(question.split()) <= SHORT


def standalone(question: str, previous: str | None, limit: int = 2000) -> str:
    """`question` as it stands alone, given the previous standalone question (None: the first)."""
    question = question.strip()
    if not previous or not is_follow_up(question):
        return question
    room = limit - len(question) - 1
    if room <= 0:
        return question
    return f"{previous.strip()[-room:]} {question}"


def standalone_chain(questions: Iterable[str], limit: int = 2000) -> str:
    """The last of `questions` (a conversation's user turns, oldest first) made standalone."""
    current: str | None = None
    for q in questions:
        current = standalone(q, current, limit)
    return current or ""
