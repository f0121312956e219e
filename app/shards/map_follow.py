"""A shard map changed while serving: the serving process follows the file at MOERAG_SHARD_MAP.

`moerag ray up --config MAP` deploys a changed map as a new Serve application beside the one
serving (`ShardMap.app_name`: one application per map version), so both run for a while. Every
POLL_SECONDS the serving process reads the file; once the new version's application is running
(`deployed`), it publishes the same catalogue version over the new shards
(`ServingStates.reshard`): a question reads the old map's state or the new one's, whole, and a
question in flight on the old state finishes on the old application. `ray up` retires the old
application (`retire`) after `--retire-after` seconds, well after every server has switched.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from app.serving.states import ServingStates
from app.shards import client as ray_client
from app.shards import map as shard_map
from app.shards import replicas as ray_shards
from app.shards.link import ShardLink
from app.shards.map import APP, ShardMap
from engine.errors import InvalidSetting

log = logging.getLogger(__name__)
POLL_SECONDS = 2.0


def retire(keep: ShardMap | None = None) -> list[str]:
    """Delete the shard applications of every map but `keep` (None: all of them); their names."""
    serve = ray_shards.require()
    gone = [name for name in serve.status().applications if name.startswith(APP + "-")]
    gone = [name for name in gone if keep is None or name != keep.app_name]
    for name in gone:
        serve.delete(name)
    return gone


class ShardMapFollower:
    def __init__(
        self,
        path: Path,
        states: ServingStates,
        version: str,
        address: str = "auto",
        timeout_seconds: float = 5.0,
        link: ShardLink | None = None,
    ) -> None:
        self.path, self.states, self.version = path, states, version
        self.address, self.timeout_seconds, self.link = address, timeout_seconds, link
        self._waiting: str | None = None  # a new version seen, its application not running yet

    def check(self) -> bool:
        """Switch to the file's map if it changed and its shards run; whether it switched."""
        try:
            new = shard_map.load(self.path)
        except InvalidSetting as exc:  # being edited, or wrong: keep serving the map that works
            log.warning("shard map %s: %s; serving map %s meanwhile", self.path, exc, self.version)
            return False
        if new.version == self.version:
            return False
        if not ray_shards.deployed(new, self.link.replica_states if self.link is not None else None):
            if self._waiting != new.version:
                log.info("shard map %s changed to %s: waiting for `moerag ray up` to run it", self.path, new.version)
                self._waiting = new.version
            return False
        self.states.reshard(ray_client.RayShards(new, self.address, self.timeout_seconds, self.link))
        log.info("serving over shard map %s (was %s)", new.version, self.version)
        self.version, self._waiting = new.version, None
        return True

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(POLL_SECONDS):
            try:
                self.check()
            except Exception:  # Ray away for a moment: keep serving the current map
                log.exception("following the shard map failed; retrying")
