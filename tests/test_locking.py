"""The data directory's lock: one holder, and the address a server records in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.core.locking import DataDirBusy, DataDirLock, running_server


def test_the_lock_names_its_holder_and_a_servers_address_only_while_held(tmp_path: Path) -> None:
    assert running_server(tmp_path) is None  # no lock file yet
    server = DataDirLock(tmp_path)
    server.acquire("http://127.0.0.1:8123")
    assert running_server(tmp_path) == "http://127.0.0.1:8123"
    with pytest.raises(DataDirBusy, match=r"pid \d+"):
        DataDirLock(tmp_path).acquire()
    server.release()
    assert running_server(tmp_path) is None  # the record is still in the file; nobody holds it

    one_shot = DataDirLock(tmp_path)
    one_shot.acquire()  # a CLI command: no address
    assert running_server(tmp_path) is None
    one_shot.release()


def test_a_lock_file_of_an_older_version_still_names_its_pid(tmp_path: Path) -> None:
    old = DataDirLock(tmp_path)
    old.acquire()
    old.path.write_text("4242")  # what versions before the address wrote
    with pytest.raises(DataDirBusy, match=r"pid 4242"):
        DataDirLock(tmp_path).acquire()
    assert running_server(tmp_path) is None
    old.release()
