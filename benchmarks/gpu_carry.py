"""What `benchmarks/gpu_check.sh` carries to a GPU machine that has no model package: the packaged
embedding model with its weights in float16 (45 MB against 91 MB, under the device tool's 64 MiB
carry), its tokenizer and configuration, in `.gpu-carry/model` (ignored by git).

    python benchmarks/gpu_carry.py   # then run gpu_check.sh on the device with carry [".gpu-carry"]

gpu_check.sh sets MOERAG_MODEL_PATH to it when it is there: the GPU test compares that model on
the GPU with the same weights in float32 on the CPU, and the embedding row measures it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.embedder import packaged_model_path

OUT = Path(__file__).resolve().parent.parent / ".gpu-carry" / "model"


def main() -> None:
    from safetensors.torch import load_file, save_file

    source = packaged_model_path()
    if OUT.exists():
        shutil.rmtree(OUT)
    shutil.copytree(source, OUT, ignore=shutil.ignore_patterns("model.safetensors", "README.md", ".gitattributes"))
    weights = load_file(str(source / "model.safetensors"))
    save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, str(OUT / "model.safetensors"))
    size = sum(f.stat().st_size for f in OUT.rglob("*") if f.is_file())
    print(f"{OUT}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
