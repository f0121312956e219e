"""The question model on ONNX Runtime, fed and pooled in NumPy (the `onnx` extra).

`Embedder.onnx_questions` exports the transformer once (`export`) and serves questions from an
`OnnxQuestions`: the model's own Rust tokenizer, configured once (`QuestionTokens`), ONNX Runtime
on the NumPy arrays, and the model's mean pooling in NumPy. sentence-transformers' input module
and its torch pooling cost ~1 ms a question more on two AMD EPYC cores (p50 7.89 against 6.81
ms, paired: `question-path.json`), all of it under the GIL; the ids are the same and
the vectors within 6e-8 (`Embedder._adopt` checks every way against eager).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

log = logging.getLogger(__name__)
Ids = npt.NDArray[np.int64]
OPSET = 17  # part of a kept graph's name (`Embedder.onnx_file`)


def has_onnxruntime() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in ("onnx", "onnxruntime"))


class QuestionTokens:
    """texts -> (ids, mask) [N, L] int64, as the model's input module would make them.

    A copy of the model's Rust tokenizer (`tokenizers.Tokenizer`) set up once for serving (its
    truncation to the window), so threads share it: the Python wrapper reconfigured it on every
    call. Each text is encoded alone and the batch padded here: `encode_batch` hands even eight
    short questions to its thread pool (0.48 ms against 0.28 ms for eight `encode` calls, and the
    pool's threads take the core the other batch runs on).
    """

    def __init__(self, backend: Any, max_length: int, pad_id: int, lower: bool) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_str(backend.to_str())  # its own copy: settings below are its own
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=max_length)
        self.pad_id, self.lower = pad_id, lower

    @classmethod
    def of(cls, model: Any) -> QuestionTokens | None:
        """For a sentence-transformers model that is a transformer, mean pooling and at most a
        normalisation, with a Rust-backed tokenizer; None for anything else (it keeps its own path)."""
        kinds = [type(m).__name__ for m in model]
        if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
            return None
        first, pooling = model[0], model[1]
        tok: Any = getattr(first, "tokenizer", None)
        backend = getattr(tok, "backend_tokenizer", None)
        if getattr(pooling, "pooling_mode", None) != "mean" or backend is None or tok.pad_token_id is None:
            return None
        lower = bool(getattr(first, "do_lower_case", False))
        return cls(backend, int(first.max_seq_length), int(tok.pad_token_id), lower)

    def __call__(self, texts: Sequence[str]) -> tuple[Ids, Ids]:
        # As the input module prepares them: stripped, lower-cased where the model says so.
        rows = [self.tokenizer.encode(t.strip().lower() if self.lower else t.strip()).ids for t in texts]
        width = max((len(r) for r in rows), default=0)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)  # [N, L], padded on the right
        mask = np.zeros((len(rows), width), dtype=np.int64)  # [N, L]
        for i, row in enumerate(rows):
            ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        return ids, mask


class OnnxQuestions:
    """The transformer on ONNX Runtime: (ids, mask) [N, L] -> hidden states [N, L, H] on `session`
    (thread-safe; it releases the GIL while it runs), or on `wide`, a session with several intra-op
    threads, if any. With `tokens`, `embed` runs the whole question path from NumPy."""

    def __init__(self, session: Any, wide: Any = None, tokens: QuestionTokens | None = None) -> None:
        self.session, self.wide, self.tokens = session, wide, tokens

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.hidden(ids.numpy(), mask.numpy()))

    def wide_call(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.hidden(ids.numpy(), mask.numpy(), wide=True))

    def embed(self, texts: Sequence[str], wide: bool = False) -> npt.NDArray[np.float32]:
        """texts -> [N, H] mean of each text's token states (not normalised); needs `tokens`."""
        assert self.tokens is not None, "no tokenizer for the NumPy path"
        ids, mask = self.tokens(texts)  # [N, L] each
        hidden = self.hidden(ids, mask, wide)  # [N, L, H]
        weights = mask[:, :, None].astype(np.float32)  # [N, L, 1]
        return (hidden * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)  # [N, H]

    def hidden(self, ids: npt.NDArray[Any], mask: npt.NDArray[Any], wide: bool = False) -> npt.NDArray[np.float32]:
        """(ids, mask) [N, L] -> hidden states [N, L, H], on the wide session when asked and built."""
        session = self.wide if wide and self.wide is not None else self.session
        feeds = {"ids": ids.astype(np.int64, copy=False), "mask": mask.astype(np.int64, copy=False)}  # [N, L]
        return np.asarray(session.run(None, feeds)[0])  # [N, L, H]


def export(
    transformer: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, wide_threads: int, kept: Path | None = None
) -> tuple[Any, Any]:
    """`transformer` ((ids, mask) -> hidden states, eval mode) exported to ONNX (dynamic batch and
    length) -> (a session with one intra-op thread, a wide one or None).

    kept: where the exported graph is kept between starts (`Embedder.onnx_file`): read from there
    when it is there (the export takes seconds, the read a fraction), else exported and written
    there whole (a temporary name, then renamed). None: a temporary file.

    The wide session (`wide_threads` > 1) spins its threads between the parallel sections of a
    call (without spinning, waking the second thread ate the gain) and stops when the call ends
    (spinning on after it cost the server's tail at one client: p95 +1.5 to +5.9 ms).
    """
    import onnx  # noqa: F401 - torch's exporter needs it
    import onnxruntime

    def options(threads: int) -> Any:
        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads, opts.inter_op_num_threads = threads, 1
        opts.log_severity_level = 3  # errors only
        return opts

    axes = {0: "batch", 1: "tokens"}
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's notes on shape branches: the caller checks instead
        path = kept if kept is not None and kept.is_file() else Path(tmp) / "question-model.onnx"
        if path != kept:
            torch.onnx.export(
                transformer,
                (ids, mask),
                path,
                input_names=["ids", "mask"],
                output_names=["hidden"],
                dynamic_axes={"ids": axes, "mask": axes, "hidden": axes},
                opset_version=OPSET,
                dynamo=False,
            )
            if kept is not None:
                _keep(path, kept)
        cpu = ["CPUExecutionProvider"]
        session = onnxruntime.InferenceSession(str(path), options(1), providers=cpu)
        wide = None
        if wide_threads > 1:
            opts = options(wide_threads)
            opts.add_session_config_entry("session.force_spinning_stop", "1")  # no spinning between calls
            wide = onnxruntime.InferenceSession(str(path), opts, providers=cpu)
    return session, wide


def _keep(exported: Path, kept: Path) -> None:
    """Copy `exported` to `kept` whole or not at all; a cache that cannot be written is only slower."""
    try:
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(f".{kept.name}.{os.getpid()}")
        shutil.copyfile(exported, partial)
        os.replace(partial, kept)
    except OSError as exc:
        log.warning("question model not kept at %s (%s)", kept, exc)
