"""The LangChain peer as a service, in moerag's own shape: FastAPI on uvicorn, one process, one route.

    python benchmarks/peer_server.py --store LANGCHAIN_DIR --port 8100

POST /ask {"question": str, "k": 10} -> {"citations": [{"source", "text"}, ...]}: LangChain's
`similarity_search` over the FAISS store saved by `peers.py langchain-build` (query embedded by
`HuggingFaceEmbeddings`, flat exact search), the top 10 a LangChain RAG service retrieves before
it prompts a model. A plain `def` route, so FastAPI runs it in its thread pool, as moerag's does.
GET /readyz answers once the store is loaded. Torch threads: the process default unless
OMP_NUM_THREADS says otherwise (`benchmarks/load.py` runs both).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, Field

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class AskIn(BaseModel):
    question: str = Field(min_length=1, max_length=2000)
    k: int = Field(10, ge=1, le=50)


def create_app(store: Path, dtype: str) -> FastAPI:
    from benchmarks.peers import LangChainRetriever

    retriever = LangChainRetriever(store, dtype=dtype)
    retriever.search("warm-up", k=1)  # the first call pays lazy initialisation
    app = FastAPI(title="LangChain peer")

    @app.get("/readyz")
    def readyz() -> dict[str, Any]:
        return {"ready": True, "vectors": retriever.size}

    @app.post("/ask")
    def ask(body: AskIn) -> dict[str, Any]:
        hits = retriever.search(body.question, k=body.k)
        return {"citations": [{"source": source, "text": text} for text, source in hits]}

    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", type=Path, required=True, help="a store saved by peers.py langchain-build")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--dtype", default="float32", help="query encoder dtype (bfloat16 to match moerag on AMX)")
    args = ap.parse_args()
    uvicorn.run(create_app(args.store, args.dtype), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
