import numpy as np
import pytest
import torch

from engine.device_choice import choose_device, choose_dtype
from engine.embedder import Embedder
from engine.errors import InvalidSetting


def test_vectors_are_normalised_and_semantic(embedder: Embedder) -> None:
    v = embedder.encode(["How do I install a package?", "Installing software packages", "Bananas are yellow"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sims = v @ v.T
    assert sims[0, 1] > sims[0, 2] + 0.2
    assert embedder.encode([]).shape == (0, 384)


@pytest.mark.slow  # loads two more models
def test_bfloat16_stays_within_tolerance_of_float32(embedder: Embedder) -> None:
    texts = [f"Sentence number {i} about databases, indexes and query planning." for i in range(16)]
    f32 = Embedder(dtype="float32").encode(texts)
    bf16 = Embedder(dtype="bfloat16").encode(texts)
    cos = (f32 * bf16).sum(axis=1)
    assert cos.min() >= 0.99, cos.min()


def test_dtype_choice() -> None:
    assert choose_dtype("float32", "cpu") == torch.float32
    assert choose_dtype("bfloat16", "cpu") == torch.bfloat16
    with pytest.raises(ValueError):
        choose_dtype("int8", "cpu")


def test_device_choice() -> None:
    """MOERAG_EMBED_DEVICE: auto takes the GPU only where torch sees one; cuda without one is refused."""
    assert choose_device("cpu") == "cpu"
    assert choose_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(InvalidSetting, match="no CUDA GPU"):
            choose_device("cuda")
    with pytest.raises(InvalidSetting, match="unknown embedding device"):
        choose_device("tpu")


def test_missing_model_path_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FileNotFoundError, match="not found"):
        Embedder(tmp_path / "nope")


@pytest.mark.slow  # ~50 s of encoding
def test_counting_and_encoding_are_safe_across_threads(embedder) -> None:  # type: ignore[no-untyped-def]
    """Issue 11 #2: count_tokens (no padding) and encode (padding) once shared tokenizer state."""
    from concurrent.futures import ThreadPoolExecutor

    texts = [("word " * n).strip() for n in (3, 400, 7, 120, 1, 900)]  # uneven, some past the window
    want_counts = embedder.count_tokens(texts)
    want_vecs = embedder.encode(texts)

    def work(i: int) -> bool:
        if i % 2:
            return embedder.count_tokens(texts) == want_counts
        return bool(np.allclose(embedder.encode(texts), want_vecs, atol=2e-2))

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(work, range(200)))
    assert all(results)


def test_the_serving_path_embeds_exactly_as_encode(embedder: Embedder) -> None:
    """`encode_questions` (one forward pass) gives `encode`'s vectors, truncation included: exactly
    when eager; once a server start compiled this shared embedder (a test before this one on the
    same worker may have started one), within the tolerance the start checked it at: 1e-6 for ONNX
    Runtime, whose kernels sum in another order (2e-7 at most on the dev questions); for the trace,
    exactly in float32, within 1e-2 in bfloat16 (a CPU with bf16 units: its fused kernels round
    otherwise on a 512-token input)."""
    texts = ["How do I undo a commit?", "word " * 600, "Wie geht's? ünïcödé"]
    runtime = embedder.question_runtime
    atol = 1e-6 if runtime.startswith("onnxruntime") else 0.0
    if runtime != "eager" and embedder.dtype_name == "bfloat16":
        atol = 1e-2
    for t in texts:
        got, want = embedder.encode_questions([t]), embedder.encode([t])
        assert np.allclose(got, want, rtol=0, atol=atol) if atol else np.array_equal(got, want), (t[:20], runtime)
    assert embedder.encode_questions([]).shape == (0, embedder.dim)


def test_the_serving_path_runs_in_many_threads_beside_bulk_encoding(embedder: Embedder) -> None:
    """encode_questions takes no lock (a tokenizer per thread): concurrent calls, with a bulk
    encode and token counting racing them, all give the single-threaded vectors."""
    import threading

    questions = [f"How do I configure option number {i} of the service?" for i in range(12)]
    expected = {q: embedder.encode_questions([q]) for q in questions}
    errors: list[BaseException] = []
    start = threading.Barrier(len(questions) + 2)

    def ask(q: str) -> None:
        start.wait()
        try:
            for _ in range(3):
                assert np.array_equal(embedder.encode_questions([q]), expected[q])
        except BaseException as exc:  # collected: a failed assert in a thread is otherwise silent
            errors.append(exc)

    def bulk() -> None:
        start.wait()
        try:
            assert embedder.encode(["a long bulk text about databases " * 20] * 16).shape[0] == 16
        except BaseException as exc:
            errors.append(exc)

    def count() -> None:
        start.wait()
        try:
            assert len(embedder.count_tokens(["some text to count"] * 500)) == 500
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    threads += [threading.Thread(target=bulk), threading.Thread(target=count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not [t for t in threads if t.is_alive()], "a thread did not finish in 120 s"
    assert not errors, errors[0]


@pytest.mark.slow  # compiles the question model
def test_the_traced_question_model_matches_eager() -> None:
    """float32: the frozen trace gives `encode`'s vectors to 1e-5, for every length up to the window."""
    emb = Embedder(dtype="float32")
    assert emb.trace_questions().startswith("traced")
    texts = ["x", "How do I undo a commit?", "a longer question about sqlite write-ahead logs " * 4, "w " * 400]
    for t in texts:
        assert np.abs(emb.encode_questions([t]) - emb.encode([t])).max() < 1e-5, t[:20]
    assert np.abs(emb.encode_questions(texts) - emb.encode(texts)).max() < 1e-5


@pytest.mark.slow  # exports it
def test_the_exported_question_model_is_kept_and_a_broken_one_replaced(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Start-up exports the question model to ONNX once per model and torch version: later starts
    read the kept graph (no export), and a kept file that is broken is exported again. ONNX serves
    float32 models: float32 is asked for, as "auto" is bfloat16 on CPUs with AVX512-BF16."""
    pytest.importorskip("onnxruntime")
    exports = []
    real = torch.onnx.export
    monkeypatch.setattr(torch.onnx, "export", lambda *a, **k: exports.append(1) or real(*a, **k))
    first = Embedder(cache_dir=tmp_path, dtype="float32")
    assert first.onnx_questions().startswith("onnxruntime") and len(exports) == 1
    kept = first.onnx_file()
    assert kept is not None and kept.is_file() and kept.parent == tmp_path
    second = Embedder(cache_dir=tmp_path, dtype="float32")
    assert second.onnx_questions().startswith("onnxruntime") and len(exports) == 1
    kept.write_bytes(b"not a graph")
    again = Embedder(cache_dir=tmp_path, dtype="float32")
    assert again.onnx_questions().startswith("onnxruntime") and len(exports) == 2
    assert kept.stat().st_size > 1_000_000
    assert [p.name for p in tmp_path.iterdir()] == [kept.name]  # no partial file left behind
