"""Where and in what precision the embedding model runs: the device (MOERAG_EMBED_DEVICE) and the
dtype (MOERAG_EMBED_DTYPE), each chosen by what the machine has."""

from __future__ import annotations

import torch

from engine.errors import InvalidSetting


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


GPU_BATCH = 256  # the least batch a GPU embeds documents in (MOERAG_EMBED_DEVICE)


def choose_device(requested: str) -> str:
    """auto: cuda when torch sees a GPU, else cpu; cuda without one is a clear error."""
    if requested not in ("auto", "cpu", "cuda"):
        raise InvalidSetting(f"unknown embedding device {requested!r}; use auto, cpu or cuda")
    if requested == "cuda" and not torch.cuda.is_available():
        raise InvalidSetting("MOERAG_EMBED_DEVICE=cuda, but torch sees no CUDA GPU here; use auto or cpu")
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return requested


def choose_dtype(requested: str, device: str) -> torch.dtype:
    """bfloat16 only where the CPU has native bf16 units (AVX512-BF16 or AMX).

    Measured with benchmarks/ingest.py: on an AVX-512 CPU *without* those units bfloat16
    embeds at half the float32 speed, so plain AVX-512 is not enough.
    """
    if requested == "float32":
        return torch.float32
    if requested == "bfloat16":
        return torch.bfloat16
    if requested != "auto":
        raise ValueError(f"unknown embedding dtype {requested!r}; use auto, float32 or bfloat16")
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    flags = _cpu_flags()
    return torch.bfloat16 if flags & {"avx512_bf16", "amx_bf16"} else torch.float32
