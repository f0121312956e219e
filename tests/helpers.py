"""Small shared helpers for tests."""

from __future__ import annotations

import time
from typing import Any

from fastapi.testclient import TestClient

TOPICS = {
    "sqlite": "SQLite stores the whole database in a single file. The write-ahead log lets readers continue "
    "while a writer appends pages; a checkpoint copies the log back into the database file.",
    "git": "Git records snapshots of a project as commits. A branch is a movable pointer to a commit, and a "
    "merge joins two lines of history while a rebase replays commits on top of another base.",
    "debian": "Debian packages are installed with apt, which resolves dependencies from the configured "
    "archive. dpkg unpacks .deb files and runs the maintainer scripts of each package.",
    "python": "Python lists are mutable sequences; tuples are immutable. A dictionary maps hashable keys "
    "to values, and comprehensions build lists, sets and dictionaries from iterables.",
}


def topic_doc(topic: str, n: int, paragraphs: int = 3) -> str:
    base = TOPICS[topic]
    return f"# {topic} note {n}\n\n" + "\n\n".join(f"{base} (variant {n}.{p})" for p in range(paragraphs))


def wait_job(client: TestClient, job_id: int, headers: dict[str, str] | None = None, timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}", headers=headers or {}).json()
        if job["status"] in ("done", "failed"):
            return job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} did not finish")
