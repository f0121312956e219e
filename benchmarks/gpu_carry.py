"""What `benchmarks/gpu_check.sh` carries to a GPU machine (Python 3.12 with torch, Triton, numpy,
scipy and sentence-transformers; no model package, no FAISS, no network), in `.gpu-carry/`
(ignored by git), under the device tool's 64 MiB carry:

- `model/`: the packaged embedding model with its weights in float16 (45 MB against 91 MB), its
  tokenizer and configuration; gpu_check.sh sets MOERAG_MODEL_PATH to it (the GPU test compares
  that model on the GPU with the same weights in float32 on the CPU; the embedding row measures it);
- `site.tar.xz`: the wheels the ask pipeline needs there (faiss-cpu, bm25s, httpx and its
  dependencies) for cp312 manylinux, installed here into one folder and packed with xz (10 MB
  against 19 MB of wheels); gpu_check.sh unpacks it onto PYTHONPATH;
- `pipeline/`: the pydoc sample store's state and the CPU service's answers
  (`benchmarks/gpu_pipeline.py prepare`).

    python benchmarks/gpu_carry.py   # then run gpu_check.sh on the device with carry [".gpu-carry"]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.embedder import packaged_model_path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / ".gpu-carry" / "model"
SITE = ROOT / ".gpu-carry" / "site.tar.xz"
# What engine and index import there beyond the GPU machine's packages (faiss-cpu as installed here).
WHEELS = ("faiss-cpu==1.15.1", "bm25s==0.3.16", "httpx", "httpcore", "h11", "anyio", "sniffio", "idna", "certifi")


def site() -> None:
    """The wheels for cp312 manylinux, installed into one folder, packed with xz."""
    with tempfile.TemporaryDirectory() as tmp:
        wheels, target = Path(tmp) / "wheels", Path(tmp) / "site"
        pip = [sys.executable, "-m", "pip", "-q"]
        platforms = [a for p in ("manylinux_2_28_x86_64", "manylinux2014_x86_64") for a in ("--platform", p)]
        subprocess.run(
            [
                *pip,
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                "3.12",
                *platforms,
                "-d",
                str(wheels),
                *WHEELS,
            ],
            check=True,
        )
        subprocess.run(
            [
                *pip,
                "install",
                "--no-deps",
                "--no-compile",
                "--target",
                str(target),
                *map(str, sorted(wheels.glob("*.whl"))),
            ],
            check=True,
        )
        subprocess.run(
            ["tar", "-cJf", str(SITE), "-C", str(target), "."], check=True, env={**os.environ, "XZ_OPT": "-9 -T2"}
        )
    print(f"{SITE}: {SITE.stat().st_size / 2**20:.1f} MiB")


def main() -> None:
    model()
    site()
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_pipeline.py"), "prepare"], check=True)
    size = sum(f.stat().st_size for f in (ROOT / ".gpu-carry").rglob("*") if f.is_file())
    print(f".gpu-carry: {size / 2**20:.1f} MiB of the 64 MiB carry")


def model() -> None:
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
