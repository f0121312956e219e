"""Dynamic batching and the question cache: same answers, isolated failures (engine/question_encoder.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

from app.core.settings import Settings
from app.runtime import Runtime
from engine.embedder import Embedder
from engine.pipeline import AskPipeline, AskRequest
from engine.question_encoder import QuestionEncoder, done_future
from engine.serving import fixed_state
from tests.conftest import TOKEN
from tests.helpers import TOPICS, topic_doc


class _Fake:
    """texts -> one row each, [len, first char code, 1]; records every batch; 'boom' fails the call."""

    def __init__(self, delay: float = 0.02, slow: str = "", slow_delay: float = 0.0) -> None:
        self.delay, self.slow, self.slow_delay = delay, slow, slow_delay
        self.batches: list[list[str]] = []
        self.threads: list[str] = []  # the thread that ran each batch

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.batches.append(list(texts))
        self.threads.append(threading.current_thread().name)
        time.sleep(self.delay + (self.slow_delay if self.slow in texts else 0.0))
        if any("boom" in t for t in texts):
            raise ValueError("cannot embed boom")
        return np.array([[len(t), ord(t[0]), 1.0] for t in texts], dtype=np.float32)  # [N, 3]


def _concurrently(qe: QuestionEncoder, questions: list[str]) -> dict[str, np.ndarray | Exception]:
    out: dict[str, np.ndarray | Exception] = {}
    start = threading.Barrier(len(questions))

    def one(q: str) -> None:
        start.wait()
        try:
            out[q] = qe.encode(q)
        except Exception as exc:
            out[q] = exc

    threads = [threading.Thread(target=one, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_questions_share_model_calls_and_get_their_own_rows() -> None:
    fake = _Fake()
    qe = QuestionEncoder(fake, max_batch=4, max_wait_ms=50, cache_size=0)
    questions = [f"{c}question {i}" for i, c in enumerate("abcdefghij")]
    out = _concurrently(qe, questions)
    for q in questions:
        assert isinstance(out[q], np.ndarray)
        assert out[q].shape == (1, 3)
        assert out[q][0].tolist() == [len(q), ord(q[0]), 1.0]  # its own row, not a neighbour's
    assert max(len(b) for b in fake.batches) > 1  # batched ...
    assert all(len(b) <= 4 for b in fake.batches)  # ... never beyond max_batch
    assert qe.stats.questions == len(questions)
    assert qe.stats.batches == len(fake.batches)
    qe.close()


def test_a_failing_question_fails_alone() -> None:
    fake = _Fake()
    qe = QuestionEncoder(fake, max_batch=8, max_wait_ms=50, cache_size=0)
    questions = ["alpha", "beta", "boom here", "gamma", "delta"]
    out = _concurrently(qe, questions)
    assert isinstance(out["boom here"], ValueError)
    for q in questions:
        if q != "boom here":
            assert isinstance(out[q], np.ndarray), out[q]
            assert out[q][0, 0] == len(q)
    assert any(len(b) > 1 and "boom here" in b for b in fake.batches)  # it was batched, then isolated
    qe.close()


def test_a_slow_question_does_not_fail_the_others() -> None:
    fake = _Fake(slow="slow one", slow_delay=0.3)
    qe = QuestionEncoder(fake, max_batch=8, max_wait_ms=20, cache_size=0)
    questions = ["slow one", "quick a", "quick b", "quick c"]
    out = _concurrently(qe, questions)
    assert all(isinstance(out[q], np.ndarray) and out[q][0, 0] == len(q) for q in questions)
    qe.close()


def test_the_cache_answers_repeats_without_the_model_and_shares_no_writable_array() -> None:
    fake = _Fake(delay=0)
    qe = QuestionEncoder(fake, max_batch=1, cache_size=2)
    a = qe.encode("a?")
    assert qe.encode("a?") is a and len(fake.batches) == 1 and qe.stats.cache_hits == 1
    with pytest.raises(ValueError):
        a[0, 0] = 7  # read-only: one caller cannot change another's vector
    qe.encode("b?")
    qe.encode("c?")  # evicts "a?", the least recently used
    qe.encode("a?")
    assert len(fake.batches) == 4


def test_a_worker_that_waited_for_more_and_found_none_left_waits_again() -> None:
    """Two workers waiting for a batch to fill: the first to time out takes every question; the
    other finds the queue empty and must wait again, not die (it did: IndexError, its thread gone)."""
    fake = _Fake(delay=0.0)
    qe = QuestionEncoder(fake, max_batch=8, max_wait_ms=100, cache_size=0, workers=2)
    first = qe.submit("first")
    time.sleep(0.01)  # the first worker is waiting for more; the second wakes for this one, waits too
    second = qe.submit("second")
    assert first.result(5) is not None and second.result(5) is not None
    time.sleep(0.25)  # past both deadlines
    assert all(t.is_alive() for t in qe._threads)
    assert qe.submit("third").result(5) is not None
    qe.close()


def test_a_submitted_question_leaves_its_caller_free_until_the_vector_is_needed() -> None:
    fake = _Fake(delay=0.2)
    qe = QuestionEncoder(fake, max_batch=4, cache_size=4)
    t = time.perf_counter()
    pending = qe.submit("overlap?")
    assert time.perf_counter() - t < 0.1 and not pending.done()  # the model runs in a batch thread
    vec = pending.result(5)
    assert vec[0].tolist() == [len("overlap?"), ord("o"), 1.0]
    again = qe.submit("overlap?")  # remembered by the batch thread: done at once, the same array
    assert again.done() and again.result() is vec and len(fake.batches) == 1
    qe.close()


@pytest.mark.parametrize("max_batch", [4, 1])
def test_closed_encoder_refuses_new_questions(max_batch: int) -> None:
    """Whichever thread would run it: a batch thread, the caller's (no batching, or a lone question)."""
    qe = QuestionEncoder(_Fake(delay=0), max_batch=max_batch, encode_wide=_Fake(delay=0))
    assert qe.encode("x")[0, 0] == 1
    qe.close()
    with pytest.raises(RuntimeError):
        qe.encode("new question")
    with pytest.raises(RuntimeError):
        qe.submit("a lone new question", alone=True)


def test_batched_answers_equal_unbatched_ones_on_the_real_pipeline(tmp_path: Path) -> None:
    """Concurrent questions through the batching server path: the same ids and scores as one at a time.

    float32, where a row does not depend on its batch (bfloat16 rounds by batch shape: see the
    module docstring and the load benchmark's measurement).
    """
    from app.services.documents import Upload

    settings = Settings(
        data_dir=tmp_path / "data",
        admin_token=TOKEN,  # type: ignore[arg-type]
        embed_dtype="float32",
        question_batch=8,
        question_batch_wait_ms=30,  # make the batches certain in a test
        question_cache=0,
    )
    rt = Runtime(settings, embedder=Embedder(dtype="float32"))
    rt.start()  # as served: the traced model, batching, two workers where there are two cores
    assert rt.question_model.startswith("onnxruntime")  # auto, float32 on a CPU, the onnx extra installed
    try:
        for t in TOPICS:
            for i in range(3):
                rt.ingestor.ingest(Upload(data=topic_doc(t, i).encode(), source=f"{t}-{i}.md", filename=f"{t}-{i}.md"))
        # BM25 over every chunk before the first question: the checkpoint thread's rebuild could
        # otherwise land between the batched answers and the lone ones (scores then differ by BM25).
        rt.lexical.refresh(force=True)
        questions = [
            "How does the write-ahead log work?",
            "What is a branch in git?",
            "How do I install a package with apt?",
            "Are tuples mutable?",
            "What does a checkpoint copy back?",
            "What does a rebase replay?",
            "Which tool unpacks .deb files?",
            "What do comprehensions build from iterables, and which keys may a dictionary use?",
        ]

        vectors: dict[str, Future[np.ndarray]] = {}
        served = rt.pipeline.submit_question

        def recorded(text: str, alone: bool) -> Future[np.ndarray]:
            vectors[text] = served(text, alone)  # still to come: the pipeline scores BM25 meanwhile, as served
            return vectors[text]

        rt.pipeline.submit_question = recorded

        def answer(q: str) -> list[tuple[int, float]]:
            p = rt.pipeline.prepare(AskRequest(q, top_k=5, mode="fallback"))
            return [(c.chunk.id, c.score) for c in p.citations]

        batched: dict[str, list[tuple[int, float]]] = {}
        start = threading.Barrier(len(questions))

        def one(q: str) -> None:
            start.wait()
            batched[q] = answer(q)

        threads = [threading.Thread(target=one, args=(q,)) for q in questions]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert rt.questions is not None and rt.questions.stats.largest > 1  # they really were batched
        emb, index = rt.embedder, rt.indexes.index
        rt.pipeline.submit_question = lambda text, alone: done_future(emb.encode([text]))  # one at a time, no batcher
        for q in questions:
            alone = answer(q)
            # The answer's chunks, in order, with their fused scores: exact ids; the scores carry the
            # cosine (convex fusion), so they agree to the model runtimes' float32 noise, as below.
            assert [i for i, _ in batched[q]] == [i for i, _ in alone], q
            assert np.allclose([s for _, s in batched[q]], [s for _, s in alone], atol=1e-6), q
            one_vec = emb.encode([q])  # [1, D]
            assert np.abs(vectors[q].result() - one_vec).max() < 1e-5, q  # float32 trace vs eager: ~1e-7
            (s_b,), (i_b,) = index.search(vectors[q].result(), 10)  # the dense scores (cosines) as well
            (s_1,), (i_1,) = index.search(one_vec, 10)
            assert i_b.tolist() == i_1.tolist(), q
            assert np.allclose(s_b, s_1, atol=1e-6), q
    finally:
        rt.close()


def test_two_workers_run_two_model_calls_at_once() -> None:
    fake = _Fake(delay=0.3)
    qe = QuestionEncoder(fake, max_batch=1 + 1, workers=2, cache_size=0)
    t = time.perf_counter()
    out = _concurrently(qe, ["first?", "second?", "third?", "fourth?"])
    elapsed = time.perf_counter() - t
    assert all(isinstance(v, np.ndarray) for v in out.values())
    assert elapsed < 0.3 * 3, elapsed  # one worker would need at least three calls in a row
    qe.close()


@pytest.mark.parametrize("runtime", ["torch", "onnxruntime"])
def test_each_question_runtime_gives_the_eager_vectors(runtime: str) -> None:
    """A trace and ONNX Runtime both serve the eager model's vectors, alone and in a padded batch."""
    emb = Embedder(dtype="float32")
    texts = ["What is a rebase?", "How do I make sqlite write a checkpoint after every transaction commit?", "x"]
    eager = emb.encode(texts)
    assert emb.compile_questions(runtime).startswith({"torch": "traced", "onnxruntime": "onnxruntime"}[runtime])
    assert np.abs(emb.encode_questions(texts) - eager).max() < 1e-4
    assert np.abs(np.vstack([emb.encode_questions([t]) for t in texts]) - eager).max() < 1e-4


def test_the_numpy_question_path_reads_the_text_as_the_model_does() -> None:
    """ONNX Runtime is fed by the model's Rust tokenizer, set up once: the same ids and mask as the
    input module makes (truncated to the window, padded to the longest), and NumPy's mean pooling
    gives the input module + torch pooling's vectors."""
    from engine.onnx_questions import OnnxQuestions, QuestionTokens

    emb = Embedder(dtype="float32")
    assert emb.compile_questions("onnxruntime").startswith("onnxruntime")
    model = emb._question_model
    assert isinstance(model, OnnxQuestions) and model.tokens is not None  # all-MiniLM: mean pooling, a Rust tokenizer
    texts = ["", "  What IS a rebase?\n", "Ünïcödé — naïve café?", "a\tb", "word " * 300, "git rebase -i HEAD~3"]
    made = emb._input_module().preprocess(texts)
    ids, mask = model.tokens(texts)  # [N, L] each
    assert ids.shape == (len(texts), 256)  # the 300 words truncated to the window, the rest padded to it
    assert np.array_equal(ids, made["input_ids"].numpy()) and np.array_equal(mask, made["attention_mask"].numpy())
    assert np.abs(emb.encode_questions(texts) - emb._forward(texts, model)).max() < 1e-6  # NumPy vs torch pooling
    # A model that pools otherwise keeps the input module's path.
    emb.model[1].pooling_mode = "cls"
    try:
        assert QuestionTokens.of(emb.model) is None
    finally:
        emb.model[1].pooling_mode = "mean"


def test_onnxruntime_on_several_threads_gives_the_same_vectors() -> None:
    """The wide session (a lone question on every core) serves exactly the one-thread session's vectors."""
    emb = Embedder(dtype="float32")
    assert emb.compile_questions("onnxruntime", wide_threads=2).startswith("onnxruntime")
    assert emb.has_wide_questions
    texts = ["What is a rebase?", "How do I make sqlite write a checkpoint after every transaction commit?", "x"]
    narrow = np.vstack([emb.encode_questions([t]) for t in texts])  # [3, D]
    wide = np.vstack([emb.encode_questions([t], wide=True) for t in texts])  # [3, D]
    assert np.array_equal(narrow, wide)
    assert np.abs(emb.encode_questions(texts, wide=True) - emb.encode(texts)).max() < 1e-4
    traced = Embedder(dtype="float32")
    traced.compile_questions("torch", wide_threads=2)
    assert not traced.has_wide_questions  # torch threads are the process's: no second way


@pytest.mark.parametrize("max_batch", [16, 1])
def test_a_lone_question_runs_wide_and_one_in_company_does_not(max_batch: int) -> None:
    narrow, wide = _Fake(delay=0.2), _Fake(delay=0.2)
    qe = QuestionEncoder(narrow, max_batch=max_batch, workers=2, cache_size=0, encode_wide=wide)
    assert qe.submit("alone", alone=True).result().tolist() == [[5, ord("a"), 1.0]]
    assert qe.submit("not alone").result() is not None  # its caller has company: one thread
    assert wide.batches == [["alone"]] and narrow.batches == [["not alone"]]
    out: dict[str, object] = {}
    first = threading.Thread(target=lambda: out.setdefault("a", qe.submit("a first", alone=True).result()))
    first.start()
    time.sleep(0.05)  # the first is in the model: the second finds a call running
    out["b"] = qe.submit("b second", alone=True).result()
    first.join(5)
    assert wide.batches == [["alone"], ["a first"]] and narrow.batches[-1] == ["b second"]
    assert qe.stats.wide == 2 and qe.stats.questions == 4
    # A wide call runs in its caller's thread (nothing to batch, nothing for the caller to do);
    # one in company, with batching on, on a batch thread.
    assert wide.threads == [threading.main_thread().name, first.name]
    assert narrow.threads[-1].startswith("moerag-question-batcher") == (max_batch > 1)
    qe.close()


def test_the_pipeline_says_whether_a_question_is_prepared_alone() -> None:
    """`alone` goes with the question to the encoder: True only while no other question is prepared."""
    seen: list[tuple[str, bool]] = []
    second_in = threading.Event()

    def submit(text: str, alone: bool) -> Future[np.ndarray]:
        seen.append((text, alone))
        if text == "first":
            second_in.wait(5)  # the first waits for its vector while the second is prepared
        else:
            second_in.set()
        raise RuntimeError("stop here")  # the route is not under test

    p = AskPipeline(
        embedder=None,
        state=lambda: fixed_state(None),
        store=None,  # type: ignore[arg-type]
        generator=None,
        submit_question=submit,  # type: ignore[arg-type]
    )

    def ask(q: str) -> None:
        with pytest.raises(RuntimeError):
            p.prepare(AskRequest(q))

    first = threading.Thread(target=ask, args=("first",))
    first.start()
    while not seen:
        time.sleep(0.01)
    ask("second")
    first.join(5)
    ask("third")  # both done: alone again
    p.in_flight = lambda: 2  # the server counts another request between its answer and its reply
    ask("fourth")
    assert seen == [("first", True), ("second", False), ("third", True), ("fourth", False)]


def test_onnxruntime_without_its_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from engine.errors import NotConfigured

    embedder = Embedder(dtype="float32")  # its own: the shared one may hold an ONNX model from a server start

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed: importing it fails
    with pytest.raises(NotConfigured, match=r"pip install 'moerag\[onnx\]'"):
        embedder.onnx_questions()
    with pytest.raises(ValueError, match="unknown question runtime"):
        embedder.compile_questions("tensorrt")


def test_auto_falls_back_to_the_trace_when_onnxruntime_fails_its_check(monkeypatch: pytest.MonkeyPatch) -> None:
    emb = Embedder(dtype="float32")
    calls: list[int] = []

    def failing(wide_threads: int = 1) -> str:
        calls.append(1)
        return "eager (onnxruntime off by 0.1)"

    monkeypatch.setattr(emb, "onnx_questions", failing)
    assert emb.compile_questions("auto").startswith("traced") and calls == [1]  # tried once, then the trace
