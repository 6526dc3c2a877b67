"""A trial's `worker.log`, kept to at most LOG_CAP_BYTES however much the worker prints (parent
side).

The worker writes its stdout and stderr into a pipe (a FIFO in the trial folder, so that any
launcher can open it by path); a thread of the search copies them into the log, and is its
only writer. When the log would pass the cap, its head is dropped and the newest
LOG_KEEP_BYTES are kept: the end of the log holds what a failed trial's reason needs (the
traceback). One writer makes that safe: the worker never holds the log file itself.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from autotune.common.output_files import open_log

LOG_CAP_BYTES = 10 * 2**20
LOG_KEEP_BYTES = 5 * 2**20
"""What is left once the cap is reached: room for as much again before the next cut."""
_READ_BYTES = 2**16
CLOSE_WAIT_S = 10.0


class CappedLog:
    """Copies what is written to `pipe_path` into `log_path`, the newest LOG_CAP_BYTES at most.

    Open it before the worker starts and `close()` it once the worker and everything it
    started have ended: until then the search holds a write end too, so the copy never takes
    a worker that has not opened the pipe yet for one that has closed it."""

    def __init__(self, log_path: Path, pipe_path: Path, cap_bytes: int = LOG_CAP_BYTES) -> None:
        self.log_path = log_path
        self.pipe_path = pipe_path
        self.cap_bytes = cap_bytes
        self.keep_bytes = min(LOG_KEEP_BYTES, cap_bytes // 2)
        pipe_path.unlink(missing_ok=True)
        os.mkfifo(pipe_path, 0o600)
        # The read end first (a FIFO opened for writing alone blocks until there is a reader).
        self._read_fd = os.open(pipe_path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(self._read_fd, True)
        self._write_fd: int | None = os.open(pipe_path, os.O_WRONLY)
        # Never through a link planted at its name; closed by the copying thread.
        self._log = open(open_log(log_path, read=True), "w+b")
        self._thread = threading.Thread(target=self._copy, name="worker-log", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Wait until everything written has been copied; the pipe is removed."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None
            # The copy ends when the last write end closes. Every process of the trial has
            # been ended by now; a write end held elsewhere must not hang the search: the
            # thread then goes on copying in the background.
            self._thread.join(CLOSE_WAIT_S)
            self.pipe_path.unlink(missing_ok=True)

    def _copy(self) -> None:
        try:
            while chunk := os.read(self._read_fd, _READ_BYTES):
                self._append(chunk)
        finally:
            os.close(self._read_fd)
            self._log.close()

    def _append(self, chunk: bytes) -> None:
        size = self._log.seek(0, os.SEEK_END)
        if size + len(chunk) > self.cap_bytes:
            kept = (self._tail(size) + chunk)[-self.keep_bytes :]
            dropped = size + len(chunk) - len(kept)
            note = f"[autotune: {dropped} earlier bytes of this log dropped; it keeps the last "
            note += f"{self.keep_bytes} bytes once it reaches {self.cap_bytes}]\n"
            self._log.seek(0)
            self._log.truncate()
            chunk = note.encode() + kept
        self._log.write(chunk)
        self._log.flush()  # the log is read while the trial runs (the view's log tail)

    def _tail(self, size: int) -> bytes:
        self._log.seek(max(0, size - self.keep_bytes))
        return self._log.read()
