"""What the durable benchmarks share: where results go, how they are written, percentiles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def write_result(path: Path, result: Any) -> Path:
    """Write one result file (JSON, indented, a newline at the end); its folder is made if missing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return float("nan")
    rank = min(len(sorted_values) - 1, max(0, int(np.ceil(p / 100 * len(sorted_values))) - 1))
    return round(sorted_values[rank], 2)
