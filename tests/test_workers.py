"""The controller's side of a worker's pipe never blocks for good: a send to a worker that stopped
reading fails within its timeout, and a stop overtakes the work queued before it."""

import os
import signal
import time

import numpy as np
import pytest

from jaxrose.workers import Inbox, Worker, WorkerError


def _echo_sizes(conn):
    """Reads messages one at a time and answers each with its size (a plain worker, no inbox)."""
    conn.send(("ready", {"platform": "cpu"}))
    while True:
        message = conn.recv()
        if message[0] == "stop":
            return
        conn.send(("size", message[1].nbytes))


def _slow_jobs(conn):
    """Takes jobs through an Inbox, as the evaluator and the actors do; each job takes 3 s."""
    inbox = Inbox(conn)
    conn.send(("ready", {"platform": "cpu"}))
    while True:
        message = inbox.get(block=True)
        if message[0] == "stop":
            return
        time.sleep(3.0)
        conn.send(("done", message[1]))


def test_a_large_message_reaches_a_reading_worker():
    worker = Worker("echo", _echo_sizes)
    worker.start(60)
    try:
        payload = np.ones(4 << 20, np.uint8)  # 4 MiB: far more than the pipe's buffer
        worker.send(("data", payload), timeout=30)
        assert worker.receive(30) == ("size", payload.nbytes)
    finally:
        worker.stop()
    assert worker.process.exitcode == 0  # it took the stop, it was not terminated


def test_a_send_to_a_stopped_worker_times_out_instead_of_blocking():
    worker = Worker("echo", _echo_sizes)
    worker.start(60)
    os.kill(worker.process.pid, signal.SIGSTOP)  # a fault injected: the worker stops reading
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match="did not read a message within 1 s"):
            worker.send(("data", np.ones(4 << 20, np.uint8)), timeout=1.0)
        assert time.monotonic() - start < 5
        # The pipe holds a partial message now: a later send is refused at once, not interleaved.
        with pytest.raises(WorkerError, match="did not read an earlier message"):
            worker.send(("data", np.ones(4, np.uint8)))
    finally:
        os.kill(worker.process.pid, signal.SIGCONT)
        start = time.monotonic()
        worker.stop()
    assert time.monotonic() - start < 8 and not worker.process.is_alive()


def test_a_killed_worker_is_named_by_its_signal():
    worker = Worker("echo", _echo_sizes)
    worker.start(60)
    os.kill(worker.process.pid, signal.SIGKILL)
    with pytest.raises(WorkerError, match=r"echo \(pid \d+\) died .*killed by SIGKILL .*out-of-memory"):
        worker.send(("data", np.ones(4, np.uint8)))
        worker.receive(10)
    worker.stop()


def test_stop_overtakes_queued_jobs():
    worker = Worker("jobs", _slow_jobs)
    worker.start(60)
    for job in range(3):  # 9 s of work queued
        worker.send(("job", job))
    time.sleep(0.5)  # the first job is running
    start = time.monotonic()
    worker.stop(timeout=10.0)
    # It finished the running job and dropped the other two: it exited itself, well before 9 s.
    assert worker.process.exitcode == 0
    assert time.monotonic() - start < 5.0
