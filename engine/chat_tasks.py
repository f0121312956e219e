"""Chat UIs' own task prompts, told apart from questions.

Open WebUI (and UIs built like it) send the chat model housekeeping prompts of their own: a title
for the chat, tags, follow-up suggestions, search queries, autocompletion. Each starts with
"### Task:" and carries the conversation inside `<chat_history>` tags, and asks for a JSON object.
They are not questions to the knowledge base: searching it for them answers a chat titled "a JSON
document". `task_of` recognises one; `brief_answer` answers it without a model, from the chat
history alone, in the JSON shape the prompt asks for.
"""

from __future__ import annotations

import json
import re

_TASK = re.compile(r"^\s*#{2,4}\s*Task:", re.IGNORECASE)
_HISTORY = re.compile(r"<chat_history>(.*?)(?:</chat_history>|$)", re.DOTALL | re.IGNORECASE)
_USER_LINE = re.compile(r"^\s*USER:\s*(.+)$", re.MULTILINE | re.IGNORECASE)
# What each task asks for: a word of its instructions -> (task, the JSON key of its answer)
_KINDS = (
    ("title", "title"),
    ("tags", "tags"),
    ("follow-up", "follow_ups"),
    ("follow_up", "follow_ups"),
    ("search quer", "queries"),
    ("queries", "queries"),
    ("emoji", "emoji"),
    ("autocomplet", "text"),
)


def task_of(prompt: str) -> str | None:
    """The JSON key a chat UI's task prompt asks for ("title", "tags", "follow_ups", "queries",
    "emoji", "text"; "task" for one of another kind), or None for a question."""
    if not _TASK.match(prompt) or not ("<chat_history>" in prompt.lower() or "### chat history" in prompt.lower()):
        return None
    head = prompt.split("\n\n", 1)[0].lower() + " " + prompt[:400].lower()
    for word, key in _KINDS:
        if word in head:
            return key
    return "task"


def first_question(prompt: str) -> str:
    """The first user message of the prompt's chat history ('' when it shows none)."""
    history = _HISTORY.search(prompt)
    found = _USER_LINE.search(history.group(1) if history else prompt)
    return found.group(1).strip() if found else ""


# Words a title leaves out of a question ("How do I ...", "What is the ...").
_FILLER = frozenset(
    "a an and are can could do does for how i in is it me my of on please should the to what when where which "
    "who why will with would you your".split()
)


def brief_answer(task: str, prompt: str) -> str:
    """A task answered without a model, as the JSON its prompt asks for: a title of the chat's
    first question's content words (at most five), and nothing made up for the rest (no tags,
    follow-ups or queries: the UI then goes on with the user's own words)."""
    words = re.sub(r"[^\w\s'-]", " ", first_question(prompt)).split()
    content = [w for w in words if w.lower() not in _FILLER] or words
    title = " ".join(w[:1].upper() + w[1:] for w in content[:5]) or "New chat"
    answers: dict[str, object] = {
        "title": {"title": title},
        "tags": {"tags": []},
        "follow_ups": {"follow_ups": []},
        "queries": {"queries": []},
        "emoji": {"emoji": ""},
        "text": {"text": ""},
    }
    return json.dumps(answers.get(task, {}), ensure_ascii=False)
