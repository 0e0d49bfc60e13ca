"""The disk's own limit: raw append + fsync of the frames the node writes, with one
writer, and with several writers sharing a flusher thread's fsyncs (group commit done by
hand). The node's durable produce figure is printed as a ratio to these."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from partition_service.log import batch as frames


def sample_frame(values: list[str]) -> bytes:
    """A frame as the node writes it for one produce batch."""
    rows = [(f"key-0-{i:06d}", v, None, 1_700_000_000_000) for i, v in enumerate(values)]
    return frames.encode(
        base_offset=0,
        record_count=len(values),
        producer_id=1,
        producer_epoch=0,
        base_sequence=0,
        flags=0,
        append_time_ms=1_700_000_000_000,
        payload=frames.encode_records(rows),
    )


@dataclass
class FsyncResult:
    frames: int
    fsyncs: int
    seconds: float
    frame_bytes: int
    records_per_frame: int = 1000

    @property
    def records_per_s(self) -> float:
        return self.frames * self.records_per_frame / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.frames * self.frame_bytes / self.seconds / 1e6


def raw_fsync_single(path: Path, frame: bytes, seconds: float) -> FsyncResult:
    """One writer: append a frame, fsync, repeat."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count = 0
    try:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            os.write(fd, frame)
            os.fsync(fd)
            count += 1
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
    return FsyncResult(count, count, elapsed, len(frame))


def raw_fsync_group(path: Path, frame: bytes, seconds: float, writers: int) -> FsyncResult:
    """``writers`` threads append frames and wait until a shared flusher thread's fsync
    covers them: group commit with nothing else around it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    cond = threading.Condition()
    state = {"written": 0, "durable": 0, "frames": 0, "fsyncs": 0, "stop": False}

    def writer() -> None:
        while True:
            with cond:
                if state["stop"]:
                    return
                os.write(fd, frame)
                state["written"] += 1
                mine = state["written"]
                cond.notify_all()
                while state["durable"] < mine and not state["stop"]:
                    cond.wait()
                if state["durable"] >= mine:
                    state["frames"] += 1

    def flusher() -> None:
        while True:
            with cond:
                while state["written"] == state["durable"] and not state["stop"]:
                    cond.wait()
                if state["stop"]:
                    return
                target = state["written"]
            os.fsync(fd)  # outside the lock: writers keep appending meanwhile
            with cond:
                state["durable"] = target
                state["fsyncs"] += 1
                cond.notify_all()

    threads = [threading.Thread(target=writer) for _ in range(writers)]
    threads.append(threading.Thread(target=flusher))
    started = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    with cond:
        state["stop"] = True
        elapsed = time.monotonic() - started
        done, fsyncs = state["frames"], state["fsyncs"]
        cond.notify_all()
    for t in threads:
        t.join()
    os.close(fd)
    return FsyncResult(done, fsyncs, elapsed, len(frame))
