"""Configuration from the environment (MOERAG_ prefix); every default runs offline on one machine."""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engine.lexical import Fusion
from engine.ocr import MAX_PAGES as OCR_PAGES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MOERAG_", env_file=None, extra="ignore")

    data_dir: Path = Field(Path("data"), description="Database, index, spool and token live here.")
    database_url: str | None = Field(None, description="Any SQLAlchemy URL; default SQLite in data_dir.")
    snapshot_url: str | None = Field(
        None,
        description="Where index snapshots live: any fsspec URL (s3://bucket/moerag with s3fs, "
        "file:///shared/moerag) shared by machines on one database; default data_dir/index.",
    )
    index_codec: Literal["flat", "sq8"] = Field(
        "flat",
        description="How the index stores vectors: flat (float32, exact scores) or sq8 (8-bit codes, a quarter "
        "of the memory). A change rebuilds the index at start.",
    )
    shard_map: Path | None = Field(
        None,
        description="A shard map (docs/shards.example.yaml) whose shards run on Ray Serve (`moerag ray up`): "
        "searches go to the shards holding the lists; unset, this process searches its own replica.",
    )
    ray_address: str = Field("auto", description="The Ray cluster that runs the shards (with shard_map).")
    shard_timeout_seconds: float = Field(
        5.0, gt=0, description="A shard that has not answered a search by then is left out: the answer is partial."
    )
    model_path: Path | None = Field(None, description="Local sentence-transformers model directory.")
    embed_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="The model's dtype: auto = bfloat16 only on CPUs with AVX512-BF16/AMX, else float32."
    )
    embed_batch_size: int = Field(32, ge=1, le=1024, description="Chunks embedded per forward pass at ingestion.")
    embed_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the embedding model runs: auto = the GPU when torch sees one (float16/bfloat16, "
        "batches of at least 256), else the CPU.",
    )
    admin_token: SecretStr | None = Field(None, description="Bearer token for writes; generated if unset.")
    read_token: SecretStr | None = Field(
        None, description="When set, every read (documents, chunks, search, ask, jobs, stats, metrics) needs it too."
    )
    max_upload_bytes: int = Field(50 * 1024 * 1024, ge=1, description="Per-file upload limit (413 above it).")
    max_bulk_files: int = Field(1000, ge=1, description="Files per bulk upload request.")
    max_request_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest body of any request but a document upload (413 above it)."
    )
    chunk_target_tokens: int = Field(254, ge=16, description="Chunk size aimed at (capped by the model window).")
    chunk_overlap_tokens: int = Field(
        32, ge=0, description="Trailing sentences, up to this many tokens, repeated at the head of the next chunk."
    )
    chunk_min_tokens: int = Field(
        48, ge=1, description="With chunk_merge_small_sections, a smaller chunk takes in the next section too."
    )
    chunk_merge_small_sections: bool = Field(
        False, description="Let a section under chunk_min_tokens merge into the next one (off: sections stay apart)."
    )
    chunk_heading_prefix: Literal["path", "title", "none"] = Field(
        "title", description="Embedded before each chunk: its heading path, its section's own title, or nothing."
    )
    max_chunks_per_document: int = Field(
        20_000, ge=1, description="A document that makes more chunks is refused whole (413 document_too_large)."
    )
    max_ocr_pages: int = Field(
        OCR_PAGES,
        ge=1,
        description="Pages of one scanned PDF read by OCR (the ocr extra); a scan of more is refused (413).",
    )
    max_document_chars: int = Field(
        5_000_000,
        ge=1,
        description="A document whose text is longer is refused (413 document_too_large) before any work is done.",
    )
    clusters: int = Field(0, ge=0, description="IVF lists at recluster; 0 picks sqrt(chunks).")
    # index.clustering.KMEANS_SEED (a test holds them equal): imported from there, the settings
    # would load FAISS, and every CLI command with them.
    cluster_seed: int = Field(
        20250601, description="k-means seed at recluster: the same store and seed give the same lists."
    )
    checkpoint_seconds: float = Field(5.0, gt=0, description="Longest delay before index changes hit disk.")
    index_log_retention_seconds: float = Field(
        600.0,
        ge=0,
        description="Index log kept at least this long after a snapshot covers it (a lagging follower rebuilds).",
    )
    job_lease_seconds: float = Field(
        15.0, gt=0, description="A running job without a heartbeat this long is another process's to finish."
    )
    max_queued_jobs: int = Field(
        100,
        ge=1,
        description="Jobs waiting to run; one more is refused (429 too_many_jobs). A recluster or router training "
        "asked for again while the same one waits gets that job back instead of a new one.",
    )
    worker_of: int = Field(0, ge=0, description="Set by `moerag serve --workers N`: the supervising process's pid.")
    route_threshold: float = Field(0.7, ge=0, le=1, description="Calibrated confidence for the expert path.")
    expert_min_score: float = Field(0.2, description="Best scoped score under this falls back to global search.")
    expert_nprobe: int = Field(
        32, ge=0, description="Expert path probes only this many of its lists nearest the question; 0 = all of them."
    )
    expert_verify_lists: int = Field(
        8,
        ge=0,
        description="Expert path checks the question's nearest lists outside the expert (at most 1/8 of all); "
        "a better chunk there sends it to the fallback. 0 = off.",
    )
    expert_verify_lexical_slack: float = Field(
        0.06,
        ge=0,
        description="The check's lexical witness: when BM25's best chunk over the whole store lies outside the "
        "expert, an outside chunk within this much of the best inside also sends it to the fallback. 0 = off.",
    )
    routing_sample: float | None = Field(
        None,
        ge=0,
        le=1,
        description="The central sample: this share of the chunks (at least 2,000) kept where questions are routed; "
        "the gate's vote and the route's check read it: a confident question asks one shard. Unset: 0.05 over "
        "shards, 0 (the whole index) in one process.",
    )
    lexical_rebuild_share: float = Field(
        0.1,
        gt=0,
        le=1,
        description="BM25 rebuilds take at most this share of the time under steady ingestion (after a rebuild "
        "of t s the next waits t / share - t); meanwhile new chunks are found by dense search alone.",
    )
    lexical_rebuild_in_child: bool = Field(
        True,
        description="BM25 rebuilds after start-up run in a child process at a lower priority, off the GIL that "
        "questions share (a file or server database; an in-memory one rebuilds in the process).",
    )
    background_niceness: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU niceness (Linux) of a server's background work (embedding uploads, index snapshots, BM25 "
        "rebuilds in their child), so questions come first on busy cores. 0 = as the questions.",
    )
    fusion: Fusion = Field(
        "convex",
        description="How both paths fuse dense and BM25 over the dense candidates: convex (cosine + weight x "
        "BM25 / the scope's best BM25) or rrf (weighted reciprocal ranks).",
    )
    lexical_weight: float = Field(0.1, ge=0, description="BM25's weight against dense (1.0) in that fusion.")
    router_probe_lists: int = Field(
        8,
        ge=0,
        description="The gate's vote: the question's nearest chunks in this many of its nearest lists (at most "
        "1/8 of all) vote for their expert. 0 = no vote (the gate reads the question and the centroids only).",
    )
    router_samples: int = Field(3000, ge=0, description="Query-like samples drawn from chunks per training.")
    router_holdout: float = Field(
        0.3, gt=0, lt=1, description="Share of documents held out (per expert) to calibrate the router on."
    )
    router_seed: int = Field(0, description="Seed of router training (samples, held-out documents, initial weights).")
    query_adapter: bool = Field(
        True,
        description="Retrieval reads the question through the active router version's query adapter (a linear "
        "map learnt from the corpus's headings with the router); false: the model's vector as it is.",
    )
    query_adapter_queries: int = Field(
        20000,
        ge=0,
        description="Heading questions a router training learns its query adapter from (embedded once per "
        "training); 0 = train no adapter.",
    )
    catalogue_poll_seconds: float = Field(
        0.5, gt=0, description="How often a process asks for catalogue changes (PostgreSQL also wakes it at once)."
    )
    ask_concurrency: int = Field(
        0,
        ge=0,
        le=256,
        description="Questions answered at once per process (0: twice the cores); more wait their turn.",
    )
    question_batch: int = Field(
        16, ge=1, le=256, description="Most concurrent questions embedded in one model call; 1 = no batching."
    )
    question_batch_wait_ms: float = Field(
        0.0, ge=0, le=50, description="How long a free model waits for more questions to batch (0: none)."
    )
    question_workers: int = Field(
        0, ge=0, le=64, description="Threads running the model on question batches; 0 = one per core."
    )
    trace_questions: bool = Field(
        True,
        description="Serve question embeddings from a compiled model (see question_runtime; checked against "
        "eager at start; eager if it differs or fails). False: eager PyTorch.",
    )
    question_runtime: Literal["auto", "torch", "onnxruntime"] = Field(
        "auto",
        description="What compiles the question model: torch (a frozen TorchScript trace), onnxruntime (ONNX "
        "Runtime; pip install 'moerag[onnx]'), or auto: onnxruntime when the model runs in float32 on a CPU and "
        "the extra is installed, else torch.",
    )
    cache_dir: Path | None = Field(
        None,
        description="What start-up compiles and keeps between starts (the question model's ONNX graph, named for "
        "the model and torch version); default $XDG_CACHE_HOME/moerag or ~/.cache/moerag.",
    )
    question_lone_threads: int = Field(
        0,
        ge=0,
        le=256,
        description="ONNX Runtime threads for a question embedded while no other is being answered (the other "
        "cores idle; the same vector); 0 = one per core, 1 = off.",
    )
    question_cache: int = Field(1024, ge=0, description="Question vectors remembered by exact text; 0 = no cache.")
    answer_cache: int = Field(
        256, ge=0, description="Routes and citations of repeated questions, kept until the catalogue changes; 0 = off."
    )
    torch_threads: int = Field(
        0, ge=0, description="Torch and FAISS threads of a serving process; 0 = one (measured best, README)."
    )
    max_question_chars: int = Field(2000, ge=1, description="Longest question /ask accepts (422 above it).")
    ask_rate_per_minute: float = Field(
        0, ge=0, description="Questions a client (address) may ask per minute, all workers together; 0 = no limit."
    )
    trusted_proxies: str = Field(
        "",
        description="Proxies whose X-Forwarded-For names the client (comma-separated addresses or networks, "
        "`*` for any): for the rate limit's key and uvicorn's forwarded_allow_ips. Empty: the peer is the client.",
    )
    max_top_k: int = Field(50, ge=1, description="Most passages a question may ask for.")
    sync_roots: str = Field(
        "",
        description="Folders `POST /admin/api/sync` may mirror, with everything under them (os.pathsep-separated "
        "absolute paths). Empty: the server syncs nothing it is sent (`moerag sync` without a server needs none).",
    )
    sync_urls: str = Field(
        "",
        description="URL prefixes (whitespace-separated) `POST /admin/api/sync` may fetch: git repositories and web "
        "sites under them. Empty: the server fetches no URL it is sent (`moerag sync` without a server needs none).",
    )
    header_seconds: float = Field(
        10.0,
        gt=0,
        description="A connection whose request headers are not complete this long after it opened "
        "(or after its last response) is closed.",
    )
    keep_alive_seconds: float = Field(5.0, gt=0, description="An idle keep-alive connection is closed after this.")
    sync_page_bytes: int = Field(
        20 * 1024 * 1024, ge=1024, description="A synced web page larger than this is refused, counted as it streams."
    )
    sync_page_seconds: float = Field(
        30.0, gt=0, description="A synced web page's whole fetch, redirects included; a slower one is cut and reported."
    )
    sync_seconds: float = Field(
        3600.0, gt=0, description="A site sync's whole crawl; the pages it did not reach by then are kept, not deleted."
    )
    openai_base_url: str | None = Field(None, description="OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1")
    openai_model: str = Field("default", description="Model name sent to the OpenAI-compatible generator server.")
    default_generator: str = Field(
        "extractive",
        pattern=r"^(extractive|openai(:\S{1,200})?)$",
        description="The fallback's generator and that of experts created without one (proposals, re-fits, "
        "the sample): extractive, openai or openai:MODEL (with MOERAG_OPENAI_BASE_URL).",
    )
    openai_api_key: SecretStr | None = Field(None, description="API key of the OpenAI-compatible generator server.")
    followup_rewrite: Literal["auto", "rule"] = Field(
        "auto",
        description="How a conversation's follow-up is made standalone: auto = by the configured model "
        "(MOERAG_OPENAI_BASE_URL, MOERAG_OPENAI_MODEL) when there is one, checked, else the rule; rule = the rule.",
    )
    kernel_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="Gate and scoped-search kernels: Triton on CUDA, torch twins otherwise."
    )
    scoped_search: Literal["auto", "faiss", "kernel"] = Field(
        "auto", description="Expert-path search: auto = the scoped kernel on CUDA, FAISS otherwise."
    )
    matrix_dtype: Literal["auto", "float32", "float16", "bfloat16"] = Field(
        "auto",
        description="How the scoped kernel's copy of the chunk vectors is stored (scores accumulate in float32): "
        "auto = float16 on a GPU, float32 on the CPU.",
    )
    log_level: str = Field("INFO", description="Log level of the server and the CLI.")
    access_log: bool = Field(True, description="uvicorn's line per request (questions are also logged in SQL).")

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies(cls, value: str) -> str:
        from app.core.proxies import parse_trusted  # refused at start-up, not at the first question

        parse_trusted(value)
        return value

    def uvicorn_proxy_options(self) -> dict[str, Any]:
        """uvicorn reads X-Forwarded-For (its access log, `request.client`) from the trusted proxies only."""
        trusted = self.trusted_proxies.strip()
        return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or ""}

    @cached_property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

    @property
    def resolved_cache_dir(self) -> Path:
        if self.cache_dir is not None:
            return self.cache_dir.expanduser().resolve()
        return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "moerag"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.resolved_data_dir / 'moerag.db'}"

    @property
    def index_dir(self) -> Path:
        return self.resolved_data_dir / "index"

    @property
    def spool_dir(self) -> Path:
        return self.resolved_data_dir / "spool"

    @property
    def token_file(self) -> Path:
        return self.resolved_data_dir / "admin_token"


# The configuration by section, in the order the README's table shows it (`configuration_table`).
# Every setting is in one section (a test holds it); INTERNAL ones are plumbing, not for users.
SECTIONS: dict[str, tuple[str, ...]] = {
    "Storage": ("data_dir", "database_url", "snapshot_url", "index_codec", "cache_dir"),
    "Model": ("model_path", "embed_dtype", "embed_batch_size", "embed_device"),
    "Access": ("admin_token", "read_token", "trusted_proxies", "ask_rate_per_minute"),
    "Limits": (
        "max_upload_bytes",
        "max_bulk_files",
        "max_request_bytes",
        "max_document_chars",
        "max_chunks_per_document",
        "max_ocr_pages",
        "max_question_chars",
        "max_top_k",
        "max_queued_jobs",
        "header_seconds",
        "keep_alive_seconds",
    ),
    "Chunking": (
        "chunk_target_tokens",
        "chunk_overlap_tokens",
        "chunk_min_tokens",
        "chunk_merge_small_sections",
        "chunk_heading_prefix",
    ),
    "Clustering and the index": (
        "clusters",
        "cluster_seed",
        "checkpoint_seconds",
        "index_log_retention_seconds",
        "catalogue_poll_seconds",
        "job_lease_seconds",
    ),
    "Routing": (
        "route_threshold",
        "expert_min_score",
        "expert_nprobe",
        "expert_verify_lists",
        "expert_verify_lexical_slack",
        "routing_sample",
        "router_probe_lists",
        "router_samples",
        "router_holdout",
        "router_seed",
        "query_adapter",
        "query_adapter_queries",
    ),
    "Retrieval (BM25 and fusion)": ("fusion", "lexical_weight", "lexical_rebuild_share", "lexical_rebuild_in_child"),
    "Serving questions": (
        "ask_concurrency",
        "answer_cache",
        "question_cache",
        "question_batch",
        "question_batch_wait_ms",
        "question_workers",
        "question_lone_threads",
        "trace_questions",
        "question_runtime",
        "torch_threads",
        "background_niceness",
    ),
    "Generation": ("default_generator", "openai_base_url", "openai_model", "openai_api_key", "followup_rewrite"),
    "Sync": ("sync_roots", "sync_urls", "sync_page_bytes", "sync_page_seconds", "sync_seconds"),
    "Expert shards (Ray Serve)": ("shard_map", "ray_address", "shard_timeout_seconds"),
    "GPU kernels": ("kernel_backend", "scoped_search", "matrix_dtype"),
    "Logging": ("log_level", "access_log"),
}
INTERNAL = frozenset({"worker_of"})  # set by `moerag serve --workers N` for its workers


def _default(name: str) -> str:
    field = Settings.model_fields[name]
    value = field.default
    if value is None:
        return "unset"
    if isinstance(value, Path):
        return f"`{value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`" if value != "" else "empty"


def configuration_table() -> str:
    """The README's configuration table (markdown), section by section, from the settings themselves."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for section, names in SECTIONS.items():
        lines.append(f"| **{section}** | | |")
        for name in names:
            description = (Settings.model_fields[name].description or "").replace("|", "\\|")
            lines.append(f"| `MOERAG_{name.upper()}` | {_default(name)} | {description} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m app.core.settings: the table, to paste between the README's markers
    print(configuration_table(), end="")
