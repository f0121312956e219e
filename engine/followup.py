"""A follow-up question made standalone before it is routed ("and how do I undo that?").

With a language model configured (MOERAG_OPENAI_BASE_URL, MOERAG_FOLLOWUP_REWRITE=auto), the
model rewrites each turn that has earlier turns (`make_standalone`); a rewrite that drops the
question's own words, invents words, or leaves a follow-up's reference unresolved is not
trusted (`accepted`), and then, or when the model fails, the rule decides.

The rule, without a language model: a question that opens with a connective ("and", "but",
"also", "so", "then", "what about", "how about", "what if", "why not"), refers back ("it",
"that", "this", "these", "those", "they", "them"), or has at most three words is
read as a follow-up and prefixed with the conversation's previous standalone question; any
other question stands alone. The prefix is cut from its start to keep the result within
`limit` characters. Routing and retrieval then see the topic the follow-up leaves implicit.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Sequence

from engine.lexical import tokenize

log = logging.getLogger(__name__)

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


# ---- a rewrite by the configured language model ----------------------------------------------

REWRITE_SYSTEM = (
    "You rewrite the last question of a conversation so that it can be understood on its own. "
    "Replace words such as 'it', 'that' and 'this' with what they refer to, and name the topic. "
    "If the question already stands alone, repeat it unchanged. Reply with the rewritten question only."
)
_EXAMPLE = (
    "Conversation:\nQ: How do I install a package with apt?\n\nLast question: and how do I remove it?\n"
    "Rewritten question:",
    "How do I remove a package installed with apt?",
)
HISTORY_TURNS = 3  # the turns a rewrite sees
ANSWER_CHARS = 300  # of each earlier answer
REWRITE_TOKENS = 96
REWRITE_SECONDS = 15.0  # a slower model is skipped for this turn: the rule answers
_LABEL = re.compile(r"^\s*(rewritten question|standalone question|question)\s*:\s*", re.IGNORECASE)

Complete = Callable[[list[dict[str, str]]], str]  # chat messages -> the model's reply


def rewrite_messages(question: str, history: Sequence[tuple[str, str | None]]) -> list[dict[str, str]]:
    """The chat that asks a model for `question` made standalone; `history`: (question, answer or
    None) of the earlier turns, oldest first (the last HISTORY_TURNS are shown)."""
    lines = []
    for asked, answer in history[-HISTORY_TURNS:]:
        lines.append(f"Q: {asked}")
        if answer:
            lines.append(f"A: {' '.join(answer.split())[:ANSWER_CHARS]}")
    return [
        {"role": "system", "content": REWRITE_SYSTEM},
        {"role": "user", "content": _EXAMPLE[0]},
        {"role": "assistant", "content": _EXAMPLE[1]},
        {
            "role": "user",
            "content": "Conversation:\n" + "\n".join(lines) + f"\n\nLast question: {question}\nRewritten question:",
        },
    ]


def accepted(reply: str, question: str, limit: int, history: str = "") -> str | None:
    """The model's rewrite, or None when it cannot stand for `question`: empty; longer than
    `limit`; without half of the question's own content words (an answer, or the previous question
    given back); with words mostly from neither the question nor `history` (the earlier turns'
    text: invented); or, for a question the rule reads as a follow-up, without a word of `history`
    (the reference left unresolved: "why?" given back as "Why?")."""
    line = next((ln.strip() for ln in reply.splitlines() if ln.strip()), "")
    line = _LABEL.sub("", line).strip().strip('"“”').strip()
    if not line or len(line) > limit:
        return None
    asked, said, earlier = set(tokenize(question)), set(tokenize(line)), set(tokenize(history))
    added = said - asked
    if len(asked & said) * 2 < len(asked) or len(added & earlier) * 2 < len(added):
        return None
    if is_follow_up(question) and not added & earlier:
        return None
    return line


def make_standalone(
    question: str,
    history: Sequence[tuple[str, str | None]],
    limit: int,
    complete: Complete | None = None,
    previous: str | None = None,
) -> tuple[str, str | None]:
    """`question` as it stands alone -> (text, how): how is "llm" (the model's rewrite, accepted),
    "rule" (the rule changed it) or None (as asked). The model is asked when `complete` is given
    and there is history; a failure or an unaccepted reply falls back to the rule, applied with
    `previous` (the previous standalone question; default: the last question of `history`)."""
    question = question.strip()
    if not history:
        return question, None
    if complete is not None:
        try:
            context = " ".join(f"{asked} {answer or ''}" for asked, answer in history[-HISTORY_TURNS:])
            text = accepted(complete(rewrite_messages(question, history)), question, limit, context)
        except Exception as exc:  # the model's server down or slow: the rule still answers
            log.warning("follow-up rewrite failed, the rule is used: %s: %s", type(exc).__name__, exc)
            text = None
        if text is not None:
            return text, "llm"
    ruled = standalone(question, previous if previous is not None else history[-1][0], limit)
    return ruled, ("rule" if ruled != question else None)
