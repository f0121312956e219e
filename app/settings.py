"""Configuration from the environment (MOERAG_ prefix); every default runs offline on one machine."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MOERAG_", env_file=None, extra="ignore")

    data_dir: Path = Field(Path("data"), description="Database, index, spool and token live here.")
    database_url: str | None = Field(None, description="Any SQLAlchemy URL; default SQLite in data_dir.")
    model_path: Path | None = Field(None, description="Local sentence-transformers model directory.")
    embed_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    embed_batch_size: int = Field(32, ge=1, le=1024)
    admin_token: SecretStr | None = Field(None, description="Bearer token for writes; generated if unset.")
    max_upload_bytes: int = Field(50 * 1024 * 1024, ge=1)
    max_bulk_files: int = Field(1000, ge=1)
    chunk_target_tokens: int = Field(200, ge=16)
    chunk_overlap_tokens: int = Field(32, ge=0)
    clusters: int = Field(0, ge=0, description="IVF lists at recluster; 0 picks sqrt(chunks).")
    checkpoint_seconds: float = Field(5.0, gt=0, description="Longest delay before index changes hit disk.")
    kernel_backend: Literal["auto", "torch", "triton"] = Field(
        "auto", description="Gate and scoped-search kernels: Triton on CUDA, torch twins otherwise."
    )
    log_level: str = "INFO"

    @cached_property
    def resolved_data_dir(self) -> Path:
        return self.data_dir.expanduser().resolve()

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
