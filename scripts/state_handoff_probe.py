"""How long an actor's env state takes to reach the learner: through the pipe (pickled, as before
2026-12-04) against `transport.publish` / `take` (shared memory). A spawned process holds a tree of
the given size (float32 leaves shaped like an env state's) and answers requests either way; the
times are the requester's, from the request to the tree in hand (what the learner waits), medians.

    python scripts/state_handoff_probe.py --megabytes 99 397 --repeats 5
"""

import argparse
import json
import multiprocessing
import statistics
import time

import numpy as np


def _tree(megabytes: float) -> dict:
    # 40 leaves of [envs, k] float32 like an MJX Data's, envs chosen for the size
    per_leaf = int(megabytes * 1e6 / 40 / 4)
    return {f"leaf{i}": np.full((per_leaf // 16, 16), i, np.float32) for i in range(40)}


def _holder(conn, megabytes):
    from jaxrose.transport import publish

    tree = _tree(megabytes)
    while True:
        kind = conn.recv()
        if kind == "stop":
            return
        conn.send(tree if kind == "pipe" else publish(tree))


def main() -> None:
    from jaxrose.transport import take

    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", nargs="+", type=float, default=[99.0, 397.0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    context = multiprocessing.get_context("spawn")
    rows = []
    for megabytes in options.megabytes:
        parent, child = context.Pipe()
        process = context.Process(target=_holder, args=(child, megabytes))
        process.start()
        row = {"megabytes": megabytes}
        for kind in ("pipe", "shared_memory"):
            seconds = []
            for _ in range(options.repeats + 1):  # the first is a warm-up
                start = time.perf_counter()
                parent.send("pipe" if kind == "pipe" else "publish")
                tree = parent.recv()
                if kind != "pipe":
                    tree = take(tree)
                seconds.append(time.perf_counter() - start)
                assert float(tree["leaf3"][0, 0]) == 3.0
            row[f"{kind}_seconds"] = statistics.median(seconds[1:])
        row["ratio"] = row["pipe_seconds"] / row["shared_memory_seconds"]
        parent.send("stop")
        process.join(60)
        rows.append(row)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
