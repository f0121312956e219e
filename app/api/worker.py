"""The entry of one `moerag serve --workers N` worker process: uvicorn's factory `app.api.worker:app`.

A worker binds its life to the supervisor's first, before it imports the model, torch and the
rest of the service (seconds): a supervisor SIGKILLed while a worker it had just started was still
loading left that worker alive until it reached the app factory, and the multiprocessing
resource tracker they shared with it. This module imports nothing heavy for that reason.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from app.core.locking import die_with_parent

if TYPE_CHECKING:
    from fastapi import FastAPI


def app() -> FastAPI:
    """The worker's app (app.api.main.worker_app), once this process dies with its supervisor."""
    parent = os.environ.get("MOERAG_WORKER_OF")
    if parent:
        die_with_parent(int(parent))
    from app.api.connections import configure
    from app.api.main import worker_app
    from app.core.settings import Settings

    configure(Settings())  # this worker's connections keep the supervisor's timeouts
    return worker_app()
