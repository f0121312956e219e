"""The embedder as a Ray Serve deployment (the `ray` extra): one model shared by every server.

A shard map with an `embedder:` section (`replicas`, `max_batch`) makes `moerag ray up` run the
embedding model in its own Serve application (`moerag-embedder`, kept across shard map versions),
and every server using that map embeds questions and documents there instead of loading the
model itself (`RemoteEmbedder`, what the runtime holds in place of `engine.embedder.Embedder`).

- Questions are batched twice: a server sends the batch its own question batching formed as one
  call, and Serve (`@serve.batch`) puts the calls waiting on a replica, from every server, through
  the model at once (at most `max_batch` questions; none held back to wait for more; as many
  batches at once as the replica's machine has cores: the compiled model runs off the GIL). A
  replica compiles its question model as a server does (MOERAG_QUESTION_RUNTIME).
- Documents go in one call a batch (an upload's chunks, a router's training samples).
- Counting tokens (chunking) stays in the server: it loads the model's tokenizer only.

Ray places the replicas, health-checks and restarts them; a question whose replica died in flight
is asked again once (Serve sends it to another replica).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from app.shards.replicas import join, replica_states, require
from engine.errors import NotConfigured

log = logging.getLogger(__name__)
APP = "moerag-embedder"  # its Serve application: one for the cluster, whatever the shard map's version
DEPLOYMENT = "embedder"
Vectors = npt.NDArray[np.float32]


class EmbedderReplica:
    """One replica: the model, its question model compiled as a server compiles it."""

    def __init__(
        self, model_path: str | None, dtype: str, batch_size: int, question_runtime: str, max_batch: int = 16
    ) -> None:
        import torch

        from engine.device_choice import choose_device
        from engine.embedder import Embedder

        # Ray gives an actor of under one CPU one thread; documents use the machine's cores.
        torch.set_num_threads(os.cpu_count() or 1)
        device = choose_device("auto")  # the replica's machine's GPU when it has one
        self.embedder = Embedder(model_path, dtype=dtype, batch_size=batch_size, device=device)
        self.question_model = self.embedder.compile_questions(question_runtime)
        self.max_batch = max_batch  # the most questions in one model call (a caller's call holds at most this)
        self.batches: list[int] = []  # sizes of the last question batches (status, tests)

    def info(self) -> dict[str, Any]:
        e = self.embedder
        return {
            "dim": e.dim,
            "name": e.name,
            "max_tokens": e.max_tokens,
            "dtype": e.dtype_name,
            "question_model": self.question_model,
            "path": str(e.path),
            "max_batch": self.max_batch,
        }

    def questions_many(self, asked: list[list[str]]) -> list[Vectors]:
        """[n, D] for each caller's n questions, in the callers' order: one forward pass for all."""
        flat = [t for texts in asked for t in texts]
        self.batches = [*self.batches[-99:], len(flat)]
        vectors = self.embedder.encode_questions(flat)  # [sum n, D]
        bounds = np.cumsum([0] + [len(texts) for texts in asked])
        return [vectors[a:b] for a, b in itertools.pairwise(bounds)]

    def documents(self, texts: list[str]) -> Vectors:
        """[N, D] the texts' vectors, as `Embedder.encode`."""
        return self.embedder.encode(texts)

    def recent_batches(self) -> list[int]:
        return list(self.batches)


def deploy(replicas: int, max_batch: int, model_path: str | None, dtype: str, batch_size: int, runtime: str) -> Any:
    """Run (or update) the embedder application with `replicas` replicas; its handle."""
    serve = require()

    class BatchedEmbedderReplica(EmbedderReplica):
        @serve.batch(
            max_batch_size=max_batch,
            batch_wait_timeout_s=0.0,
            batch_size_fn=lambda asked: sum(len(texts) for texts in asked),  # questions, not calls
            # The compiled model runs off the GIL: a batch a core (of the machine running `ray up`;
            # Serve fixes this when the class is made, not where a replica lands).
            max_concurrent_batches=os.cpu_count() or 1,
        )
        async def questions(self, asked: list[list[str]]) -> list[Vectors]:
            return await asyncio.to_thread(self.questions_many, asked)

    deployment = serve.deployment(
        BatchedEmbedderReplica,
        name=DEPLOYMENT,
        num_replicas=replicas,
        ray_actor_options={"num_cpus": 0.5},  # a core while it runs; half lets Ray place it beside shards on 2
        max_ongoing_requests=max_batch * 2,  # a batch in the model and the next one forming
    )
    serve.start(proxy_location="Disabled")
    serve.run(deployment.bind(model_path, dtype, batch_size, runtime, max_batch), name=APP, route_prefix=None)
    return serve.get_deployment_handle(DEPLOYMENT, app_name=APP)


def _replicas() -> dict[str, int] | None:
    """{replica state: how many} of the embedder deployment; None when its application is not running."""
    states = replica_states(APP)
    return None if states is None else states.get(DEPLOYMENT, {})


def running(replicas: int, max_batch: int) -> bool:
    """Whether the embedder application runs as asked, this many replicas calling the model on at
    most `max_batch` questions (then `ray up` leaves it; otherwise it deploys it again)."""
    counts = _replicas()
    if counts is None or counts.get("RUNNING", 0) != replicas:
        return False
    info = require().get_deployment_handle(DEPLOYMENT, app_name=APP).info.remote().result(timeout_s=10)
    return bool(info["max_batch"] == max_batch)


def status() -> dict[str, Any]:
    """The embedder application for `moerag ray status`: its replicas by state, one replica's model
    and the sizes of its last question calls (Serve's batching at work)."""
    counts = _replicas()
    if counts is None:
        return {"running": False}
    handle = require().get_deployment_handle(DEPLOYMENT, app_name=APP)
    batches = handle.recent_batches.remote().result(timeout_s=10)
    return {
        "running": True,
        "replicas": counts,
        "model": handle.info.remote().result(timeout_s=10),
        "question_calls": len(batches),
        "mean_questions_a_call": round(sum(batches) / len(batches), 2) if batches else None,
    }


class RemoteEmbedder:
    """`engine.embedder.Embedder`'s serving interface over the embedder deployment. Vectors come
    from the deployment; token counts from the model's tokenizer, loaded here (a few MB)."""

    has_wide_questions = False  # no idle cores to widen onto: the model runs elsewhere

    def __init__(self, handle: Any, model_path: str | Path | None = None, timeout_seconds: float = 60.0) -> None:
        """`model_path`: this machine's copy of the model the replicas run (its tokenizer is read);
        None: the packaged one."""
        from transformers import AutoTokenizer

        from engine.embedder import packaged_model_path

        self.handle, self.timeout_seconds = handle, timeout_seconds
        try:
            info = self._call(lambda: handle.info.remote())
        except Exception as exc:  # not deployed, or not answering
            raise NotConfigured(
                f"the embedder deployment does not answer ({type(exc).__name__}): the shard map has an "
                "`embedder:` section, so run `moerag ray up --config MAP` first"
            ) from None
        self.dim, self.name, self.max_tokens = int(info["dim"]), str(info["name"]), int(info["max_tokens"])
        self.max_batch, self.dtype_name = int(info["max_batch"]), str(info["dtype"])
        self.question_runtime = f"the embedder deployment ({info['question_model']})"
        self.path = Path(model_path) if model_path else packaged_model_path()
        self._counter = AutoTokenizer.from_pretrained(str(self.path), local_files_only=True)
        self._count_lock = threading.Lock()  # a fast tokenizer keeps call settings as state

    @classmethod
    def connect(cls, address: str = "auto", model_path: str | Path | None = None) -> RemoteEmbedder:
        """The embedder application's handle in the Ray cluster at `address` (`ray up` started it)."""
        join(address)
        return cls(require().get_deployment_handle(DEPLOYMENT, app_name=APP), model_path)

    def _call(self, ask: Callable[[], Any]) -> Any:
        return self._await(ask(), ask)

    def _await(self, response: Any, ask: Callable[[], Any]) -> Any:
        """`response`'s result; asked once more (`ask`) if the replica answering it died."""
        from ray.exceptions import RayActorError  # the replica died, or cannot be reached

        try:
            return response.result(timeout_s=self.timeout_seconds)
        except RayActorError as exc:
            log.warning("an embedder replica died answering; asking another: %s", exc)
            return ask().result(timeout_s=self.timeout_seconds)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        with self._count_lock:
            enc = self._counter(list(texts), add_special_tokens=False, truncation=False, verbose=False)
        return [len(ids) for ids in enc["input_ids"]]

    def encode(self, texts: Sequence[str], *, background: bool = False) -> Vectors:
        """[N, D] as `Embedder.encode` (the replica's model; `background` is the replica's concern)."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out: Vectors = self._call(lambda: self.handle.documents.remote(list(texts)))
        return out

    def encode_questions(self, texts: Sequence[str], *, wide: bool = False) -> Vectors:
        """[N, D]: one call for the caller's batch (a server's own question batching), which Serve
        batches again with the other servers' questions on the replica."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        step = self.max_batch  # a call holds at most what the replica puts in one model call
        asked = [partial(self.handle.questions.remote, list(texts[i : i + step])) for i in range(0, len(texts), step)]
        sent = [ask() for ask in asked]  # all sent before any is awaited
        return np.concatenate([self._await(response, ask) for response, ask in zip(sent, asked, strict=True)])

    def lower_document_priority(self, niceness: int) -> None:
        """Nothing to lower here: documents are embedded on the deployment's replicas."""

    def compile_questions(self, runtime: str = "auto", *, wide_threads: int = 1) -> str:
        return self.question_runtime
