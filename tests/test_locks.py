"""The index's readers-writer lock (index.locks.ReadWrite): reads together, a write alone, a
waiting write goes before new searches (no starvation) except while a snapshot is being
serialized (a background read), which the write has to wait for anyway."""

from __future__ import annotations

import threading

from index.locks import ReadWrite


def _blocked(fn: object) -> threading.Thread:
    thread = threading.Thread(target=fn)  # type: ignore[arg-type]
    thread.start()
    thread.join(0.2)
    return thread


def test_a_write_waits_for_a_snapshot_while_searches_go_in() -> None:
    lock = ReadWrite()
    long_read_in, release_long_read = threading.Event(), threading.Event()
    order: list[str] = []

    def snapshot() -> None:
        with lock.read(background=True):
            long_read_in.set()
            release_long_read.wait(10)
            order.append("snapshot done")

    def write() -> None:
        with lock.write():
            order.append("write")

    reader = threading.Thread(target=snapshot)
    reader.start()
    assert long_read_in.wait(10)
    writer = _blocked(write)
    assert writer.is_alive() and order == []  # the write waits for the read in flight
    with lock.read():  # ... while a search goes straight in
        order.append("search")
    release_long_read.set()
    reader.join(10)
    writer.join(10)
    assert order == ["search", "snapshot done", "write"]

    def read_after() -> None:
        with lock.read():
            order.append("after write")

    with lock.write():  # a read waits for a write that holds the lock
        later = _blocked(read_after)
        assert later.is_alive()
    later.join(10)
    assert order[-1] == "after write"


def test_a_waiting_write_goes_before_new_searches() -> None:
    lock = ReadWrite()
    search_in, release_search = threading.Event(), threading.Event()
    order: list[str] = []

    def search() -> None:
        with lock.read():
            search_in.set()
            release_search.wait(10)
            order.append("search in flight done")

    def write() -> None:
        with lock.write():
            order.append("write")

    def later_search() -> None:
        with lock.read():
            order.append("later search")

    first = threading.Thread(target=search)
    first.start()
    assert search_in.wait(10)
    writer = _blocked(write)
    later = _blocked(later_search)
    assert writer.is_alive() and later.is_alive()  # the new search queues behind the write
    release_search.set()
    for thread in (first, writer, later):
        thread.join(10)
    assert order == ["search in flight done", "write", "later search"]
