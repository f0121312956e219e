"""The shard map: which experts' lists each shard holds (a YAML file, `docs/shards.example.yaml`).

    shards:
      - name: code          # a shard: a name, the experts it holds, its replicas
        experts: [git, python]
        replicas: 2
        autoscaling:        # optional: Serve scales its replicas within these bounds
          min_replicas: 1
          max_replicas: 4
          target_ongoing_requests: 8
      - name: rest
        experts: [sqlite]
        default: true       # also holds every list no named expert owns
    embedder:               # optional: the model runs on Ray too (app.shards.embedder), not in each server
      replicas: 1
      max_batch: 16         # the most questions a replica embeds in one call
    ingress:                # optional: the app itself runs on Ray, behind Serve's HTTP proxy (app.shards.ingress)
      replicas: 2
      host: 127.0.0.1
      port: 8000

Every list belongs to exactly one shard: its expert's, or the default shard's when no expert
owns it or its expert is not named. A map is checked when read (a clear error names what is
wrong) and against the store's experts when applied (`lists_of_shards`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from engine.errors import InvalidSetting
from engine.serving import ExpertProfile
from index.shards import shard_of_lists

APP = "moerag-shards"  # + "-<map version>": the Serve application holding a map's shard deployments


@dataclass(frozen=True)
class Autoscaling:
    """Serve's autoscaling of a shard's replicas: between the bounds, aiming at this many searches
    in flight a replica (a replica answers up to 32 at once in one scan)."""

    min_replicas: int
    max_replicas: int
    target_ongoing_requests: float = 8.0


@dataclass(frozen=True)
class Shard:
    name: str
    experts: tuple[str, ...]
    replicas: int = 1  # with autoscaling: how many it starts with
    default: bool = False
    autoscaling: Autoscaling | None = None


@dataclass(frozen=True)
class EmbedderSpec:
    replicas: int = 1
    max_batch: int = 16


@dataclass(frozen=True)
class IngressSpec:
    replicas: int = 1
    host: str = "127.0.0.1"
    port: int = 8000


@dataclass(frozen=True)
class ShardMap:
    shards: tuple[Shard, ...]
    version: str  # the file's content hash: what responses and `ray status` name
    embedder: EmbedderSpec | None = None  # the model on Ray Serve (app.shards.embedder); None: in each server
    ingress: IngressSpec | None = None  # the app itself on Ray Serve (app.shards.ingress); None: `moerag serve`

    @property
    def app_name(self) -> str:
        """Its Serve application (app.shards.replicas): one per map version, so a changed map's shards
        run beside the serving ones until the servers switch (app.shards.map_follow)."""
        return f"{APP}-{self.version}"

    @property
    def default(self) -> int:
        return next(i for i, s in enumerate(self.shards) if s.default)

    def lists_of_shards(self, experts: Mapping[int, ExpertProfile], nlist: int) -> list[npt.NDArray[np.int64]]:
        """The lists each shard holds, in map order, from the experts' clusters."""
        by_name = {p.name: p for p in experts.values()}
        unknown = sorted({e for s in self.shards for e in s.experts} - set(by_name))
        if unknown:
            raise InvalidSetting(
                f"the shard map names experts the store does not have: {unknown}; it has: {sorted(by_name)}"
            )
        shard_of_expert = {by_name[e].id: i for i, s in enumerate(self.shards) for e in s.experts}
        owners: list[int | None] = [None] * nlist
        for p in experts.values():
            for c in p.clusters:
                if 0 <= c < nlist:
                    owners[c] = p.id
        shard = shard_of_lists(owners, shard_of_expert, self.default)
        return [np.flatnonzero(shard == i) for i in range(len(self.shards))]


def parse(data: Any, version: str = "") -> ShardMap:  # noqa: C901
    """A shard map from its parsed YAML; InvalidSetting says what is wrong."""
    if not isinstance(data, dict) or not isinstance(data.get("shards"), list) or not data["shards"]:
        raise InvalidSetting("a shard map is a mapping with a non-empty list 'shards'")
    shards: list[Shard] = []
    seen: set[str] = set()
    owned: dict[str, str] = {}  # expert -> its shard
    for n, raw in enumerate(data["shards"]):
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not raw["name"].strip():
            raise InvalidSetting(f"shard {n}: needs a 'name'")
        name = raw["name"].strip()
        if name in seen:
            raise InvalidSetting(f"shard {name!r} is named twice")
        seen.add(name)
        experts = raw.get("experts", [])
        if not isinstance(experts, list):
            raise InvalidSetting(f"shard {name!r}: 'experts' is a list of expert names")
        for e in experts:
            if not isinstance(e, str):  # YAML read `json: csv` as a mapping, `2024` as a number...
                raise InvalidSetting(
                    f"shard {name!r}: {e!r} is not an expert name; quote names in YAML when they hold ': ', "
                    f"' #', or look like a number or a date: - \"Python: module json\""
                )
        for e in experts:
            if e in owned:
                raise InvalidSetting(f"expert {e!r} is in shards {owned[e]!r} and {name!r}; an expert has one shard")
            owned[e] = name
        replicas = raw.get("replicas", 1)
        if not isinstance(replicas, int) or isinstance(replicas, bool) or not 1 <= replicas <= 64:
            raise InvalidSetting(f"shard {name!r}: 'replicas' is a whole number from 1 to 64")
        scaling = _autoscaling(name, raw.get("autoscaling"), replicas)
        shards.append(Shard(name, tuple(experts), replicas, bool(raw.get("default", False)), scaling))
    defaults = [s.name for s in shards if s.default]
    if len(defaults) != 1:
        raise InvalidSetting(f"exactly one shard has 'default: true' (it holds unowned lists); found {defaults}")
    if not version:  # a map not read from a file: named by its content
        version = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    return ShardMap(tuple(shards), version, _embedder(data.get("embedder")), _ingress(data.get("ingress")))


def _autoscaling(shard: str, raw: Any, replicas: int) -> Autoscaling | None:
    if raw is None:
        return None
    fields = {"min_replicas", "max_replicas", "target_ongoing_requests"}
    if not isinstance(raw, dict) or set(raw) - fields or not {"min_replicas", "max_replicas"} <= set(raw):
        raise InvalidSetting(
            f"shard {shard!r}: 'autoscaling' is a mapping of min_replicas, max_replicas (and target_ongoing_requests)"
        )
    low, high, target = raw["min_replicas"], raw["max_replicas"], raw.get("target_ongoing_requests", 8.0)
    whole = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high))
    if not whole or not 1 <= low <= high <= 64:  # never none: a shard at zero replicas answers nothing
        raise InvalidSetting(f"shard {shard!r}: autoscaling needs 1 <= min_replicas <= max_replicas <= 64")
    if not low <= replicas <= high:
        raise InvalidSetting(f"shard {shard!r}: 'replicas' ({replicas}, the start) lies outside the autoscaling bounds")
    if isinstance(target, bool) or not isinstance(target, int | float) or not 0 < target <= 1024:
        raise InvalidSetting(f"shard {shard!r}: target_ongoing_requests is a number above 0 (at most 1024)")
    return Autoscaling(low, high, float(target))


def _embedder(raw: Any) -> EmbedderSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"replicas", "max_batch"}:
        raise InvalidSetting("'embedder' is a mapping of 'replicas' (1-64) and 'max_batch' (1-256)")
    spec = EmbedderSpec(raw.get("replicas", 1), raw.get("max_batch", 16))
    for name, value, top in (("replicas", spec.replicas, 64), ("max_batch", spec.max_batch, 256)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise InvalidSetting(f"embedder: {name!r} is a whole number from 1 to {top}")
    return spec


def _ingress(raw: Any) -> IngressSpec | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) - {"replicas", "host", "port"}:
        raise InvalidSetting("'ingress' is a mapping of 'replicas' (1-64), 'host' and 'port' (1-65535)")
    spec = IngressSpec(raw.get("replicas", 1), raw.get("host", "127.0.0.1"), raw.get("port", 8000))
    for name, value, top in (("replicas", spec.replicas, 64), ("port", spec.port, 65535)):
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= top:
            raise InvalidSetting(f"ingress: {name!r} is a whole number from 1 to {top}")
    if not isinstance(spec.host, str) or not spec.host.strip():
        raise InvalidSetting("ingress: 'host' is the address Serve's HTTP proxy binds (127.0.0.1 by default)")
    return spec


def load(path: Path) -> ShardMap:
    """Read and check a shard map file."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidSetting(f"cannot read the shard map {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidSetting(f"the shard map {path} is not YAML: {exc}") from None
    return parse(data, hashlib.sha256(text.encode()).hexdigest()[:12])
