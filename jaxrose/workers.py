"""Worker processes: spawned (never forked), each with its own environment set before JAX starts.

A worker runs `target(conn, *args)` and talks to the controller over a pipe. The controller never
waits on a worker blindly: every receive polls with a timeout and checks that the process is still
alive, and every send runs in a thread the controller watches the same way (a message larger than
the pipe's buffer blocks until the worker reads it), so a worker that dies or hangs becomes a
`WorkerError`, not a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
import traceback
import warnings
from typing import Any, Callable, Iterator, Optional


WORKER_VARIABLE = "JAXROSE_WORKER"  # set in every worker process: its name


class WorkerError(RuntimeError):
    """A worker died, hung, or raised; the message names the worker and what to do."""


@contextlib.contextmanager
def _environment(changes: dict[str, str]) -> Iterator[None]:
    # A spawned child copies os.environ at start, so this is how its CUDA/MPS settings are fixed
    # before it can import JAX.
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _worker_main(target: Callable, conn, args: tuple) -> None:
    try:
        target(conn, *args)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc()))
        raise


class Worker:
    """One spawned process. `start` waits for its ("ready", info) message."""

    def __init__(self, name: str, target: Callable, args: tuple = (), env: Optional[dict[str, str]] = None,
                 send_timeout: float = 300.0):
        self.name = name
        self.send_timeout = send_timeout  # how long a send may wait for the worker to read it
        self._wedged = False  # a send timed out part-way: the pipe holds a partial message
        self._ready = False
        self._ctx = mp.get_context("spawn")
        self._conn, self._child_conn = self._ctx.Pipe()
        self.process = self._ctx.Process(target=_worker_main, args=(target, self._child_conn, args), name=name,
                                         daemon=True)
        self.env = dict(env or {})
        self.info: dict = {}

    def start(self, ready_timeout: float = 300.0) -> dict:
        """Starts the process and waits until it is ready; `info['start_seconds']` is what starting
        cost (under MPS, the price of changing a worker's fixed SM quota by restarting it)."""
        self.launch()
        return self.wait_ready(ready_timeout)

    def launch(self) -> None:
        """Starts the process without waiting: launch several, then `wait_ready` each, and they
        import and build concurrently."""
        self._launched = time.perf_counter()
        # A worker serves its trainer alone: it never joins the trainer's `jax.distributed` run.
        with _environment({**self.env, WORKER_VARIABLE: self.name}):
            self.process.start()
        self._child_conn.close()

    def wait_ready(self, timeout: float = 300.0) -> dict:
        kind, *payload = self.receive(timeout)
        if kind != "ready":
            raise WorkerError(f"Worker {self.name} sent {kind!r} before it was ready.")
        self.info = {**payload[0], "start_seconds": time.perf_counter() - self._launched}
        self._ready = True
        from jaxrose.mps import MpsAttachWarning, attachment_problem

        problem = attachment_problem(self.env, self.info)
        if problem is not None:  # verified from the SM count the worker's JAX reports
            self.info["mps_attached"] = False
            warnings.warn(f"Worker {self.name}: {problem}.", MpsAttachWarning, stacklevel=2)
        return self.info

    def send(self, message: Any, timeout: Optional[float] = None) -> None:
        """Sends `message`; raises a `WorkerError` if the worker dies, or has not read it within
        `timeout` seconds (default `send_timeout`), instead of blocking for good."""
        if self._wedged:
            raise WorkerError(f"Worker {self.name} (pid {self.process.pid}) did not read an earlier message; "
                              f"it cannot take more. Stop it and restart the run from its last checkpoint.")
        timeout = self.send_timeout if timeout is None else timeout
        failure: list[BaseException] = []

        def deliver() -> None:
            try:
                self._conn.send(message)
            except BaseException as error:  # re-raised below, in the caller's thread
                failure.append(error)

        sender = threading.Thread(target=deliver, name=f"{self.name}-send", daemon=True)
        sender.start()
        deadline = time.monotonic() + timeout
        while True:
            sender.join(0.05)
            if not sender.is_alive():
                break
            if not self.process.is_alive():
                self._wedged = True
                raise self.death_error("while a message to it was being sent")
            if time.monotonic() > deadline:
                self._wedged = True
                raise WorkerError(f"Worker {self.name} (pid {self.process.pid}) did not read a message within "
                                  f"{timeout:.0f} s; it may be hung. It will be stopped; check its device and logs.")
        if failure:
            error = failure[0]
            if isinstance(error, (BrokenPipeError, EOFError, OSError)):
                raise self.death_error(f"while sending ({error})") from error
            raise error

    def poll(self) -> bool:
        return self._conn.poll()

    def receive(self, timeout: float) -> tuple:
        deadline = time.monotonic() + timeout
        while True:
            if self._conn.poll(0.05):
                try:
                    message = self._conn.recv()
                except (EOFError, OSError) as error:
                    raise self.death_error(f"before answering{f' ({error})' if str(error) else ''}") from error
                if message[0] == "error":
                    raise WorkerError(f"Worker {self.name} raised an exception:\n{message[1]}")
                return message
            if not self.process.is_alive():
                raise self.death_error("before answering")
            if time.monotonic() > deadline:
                raise WorkerError(f"Worker {self.name} (pid {self.process.pid}) did not answer within {timeout:.0f} s; "
                                  f"it may be hung. It will be stopped; check its device and logs.")

    def death_error(self, when: str) -> WorkerError:
        """The error to raise for a worker found dead (reaps it first, to read its exit code)."""
        self.process.join(1.0)
        code = self.process.exitcode
        if code is not None and code < 0:
            cause = f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
            if -code == signal.SIGKILL:
                cause += " (often the kernel's out-of-memory killer: check `dmesg` and the run's memory use)"
        else:
            cause = f"exit code {code}"
        if not self._ready:
            return WorkerError(f"Worker {self.name} (pid {self.process.pid}) died {when}, while starting up, "
                               f"{cause}. Nothing was trained; its own output above says why.")
        return WorkerError(f"Worker {self.name} (pid {self.process.pid}) died {when}, {cause}. The run stopped; "
                           f"the last checkpoint is intact and `--run.resume` continues from it.")

    def stop(self, timeout: float = 10.0) -> None:
        """Asks the worker to finish (it drops what it has not started), then terminates and finally
        kills it if it does not."""
        if self.process.is_alive() and not self._wedged:
            with contextlib.suppress(Exception):
                self.send(("stop",), timeout=min(timeout, 5.0))
            self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(2.0)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(2.0)
        self._conn.close()


class Inbox:
    """A worker's messages, read by a thread as they arrive, so a controller sending to a busy worker
    (its main thread inside a jitted call) never waits for it; a closed pipe reads as ("stop",), and
    a stop overtakes the messages queued before it."""

    def __init__(self, conn):
        self._queue: queue.Queue = queue.Queue()
        self._conn = conn
        self._stopped = threading.Event()
        threading.Thread(target=self._read, name="worker-inbox", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = self._conn.recv()
            except (EOFError, OSError):  # the controller is gone
                message = ("stop",)
            if message[0] == "stop":
                self._stopped.set()
            self._queue.put(message)
            if message[0] == "stop":
                return

    def get(self, block: bool) -> Optional[tuple]:
        if self._stopped.is_set():
            return ("stop",)
        try:
            return self._queue.get(block=block)
        except queue.Empty:
            return None
