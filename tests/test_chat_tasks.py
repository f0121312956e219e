"""A chat UI's own task prompts are told apart from questions, and answered in the JSON they ask for."""

import json

from engine.chat_tasks import brief_answer, task_of

HISTORY = "<chat_history>\nUSER: What is the WAL mode of SQLite?\nASSISTANT: A journal mode [1].\n</chat_history>"


def test_each_task_is_recognised_and_a_question_is_not() -> None:
    tags = "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history.\n" + HISTORY
    follow = "### Task:\nSuggest 3-5 relevant follow-up questions or prompts that the user might ask.\n" + HISTORY
    queries = "### Task:\nAnalyze the chat history to determine the necessity of generating search queries.\n" + HISTORY
    assert [task_of(p) for p in (tags, follow, queries)] == ["tags", "follow_ups", "queries"]
    assert task_of("What is the WAL mode of SQLite?") is None
    assert task_of("### Task: explain this heading style") is None  # no chat history: a question
    assert json.loads(brief_answer("tags", tags)) == {"tags": []}
    assert json.loads(brief_answer("title", "### Task:\nTitle\n" + HISTORY)) == {"title": "WAL Mode SQLite"}
