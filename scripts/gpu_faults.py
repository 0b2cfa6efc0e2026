"""The GPU-only faults of the reliability issue (#10), on the GPU machine. Prints one JSON object.

Cases (each bounded: every wait has a timeout; every MPS daemon started here is stopped at the end,
and killed if `quit` does not answer; only processes this script started are ever signalled):
  mps_missing          control binary missing, or failing to start: MpsDaemon.start() is False with a
                       warning, and a worker still runs JAX work on the GPU (time slicing)
  client_killed        three attached MPS clients busy with JAX work; SIGKILL one mid-work: is it
                       reported, do the other two go on, does the daemon answer, does a new client attach?
  server_killed        SIGKILL the MPS server under two busy clients: what each reports, and how soon
  control_killed       SIGKILL the MPS control daemon under a busy client: does it go on; can a new one start?
  train_helper_killed  `jaxrose train` with a plan helper, trainer and helper MPS clients of one daemon:
                       SIGKILL the helper; expected: exit code 2, "Worker helper (pid …) died"
  train_server_killed  the same run; SIGKILL the MPS server: the trainer must exit (or is recorded as a hang
                       and killed) within --exit-timeout seconds

Usage, on the GPU machine from the repository root:
    . scripts/gpu_setup.sh && timeout 520 python3 scripts/gpu_faults.py --out faults.json
    python3 scripts/gpu_faults.py --cases client_killed,train_helper_killed
Without a GPU it prints {"gpu": false, ...} and exits 0; --dry-run runs the cases that need no MPS
on the CPU (plain processes), which checks this script's own machinery.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jaxrose.mps as mps  # noqa: E402
from jaxrose import manifest  # noqa: E402
from jaxrose.mps import MpsDaemon, attachment_problem, expected_sm_count, gpu_count, unavailable_reason  # noqa: E402
from jaxrose.workers import Worker, WorkerError  # noqa: E402

CASES = ("mps_missing", "client_killed", "server_killed", "control_killed", "train_helper_killed",
         "train_server_killed")
DRY_RUN_CASES = ("mps_missing", "client_killed", "train_helper_killed")
QUOTA = 30
NO_PREALLOCATION = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}  # several clients share one GPU's memory


def busy(conn, size: int, repeats: int, pause: float) -> None:
    """Worker: JAX work in a loop, one ("beat", n, seconds) per call, until any message arrives."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(x):
        return jax.lax.fori_loop(0, repeats, lambda _, y: jnp.tanh(y @ y), x)

    x = jnp.full((size, size), 0.01, jnp.float32)
    work(x).block_until_ready()
    device = jax.devices()[0]
    conn.send(("ready", {"platform": device.platform, "kind": device.device_kind,
                         "core_count": getattr(device, "core_count", None), "pid": os.getpid()}))
    beat = 0
    while not conn.poll():
        start = time.perf_counter()
        x = work(x)
        x.block_until_ready()
        beat += 1
        conn.send(("beat", beat, time.perf_counter() - start))
        time.sleep(pause)  # > 0 on the CPU only, where busy workers would starve everything else


class Lab:
    """Settings for one run of the script, and the helpers every case uses."""

    def __init__(self, args):
        self.args = args
        self.dry_run = args.dry_run
        self.work = (256, 20, 0.05) if self.dry_run else (4096, 200, 0.0)
        self.platform_env = {"JAX_PLATFORMS": "cpu"} if self.dry_run else {}

    def worker(self, name: str, env: dict) -> Worker:
        return Worker(name, busy, self.work, {**NO_PREALLOCATION, **self.platform_env, **env})

    def daemon(self) -> MpsDaemon | None:
        if self.dry_run:
            return None
        daemon = MpsDaemon()
        return daemon if daemon.start() else None


def watch(workers: dict[str, Worker], seconds: float, since: float | None = None) -> dict:
    """Collects beats for `seconds`; per worker: beats, the last beat's time, and how it ended if it
    did (error text, exit code, when; times in seconds from `since`)."""
    since = time.monotonic() if since is None else since
    status = {name: {"beats": 0, "last_beat_s": None, "ended": None} for name in workers}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(s["ended"] is None for s in status.values()):
        for name, worker in workers.items():
            entry = status[name]
            if entry["ended"] is not None:
                continue
            try:
                while worker.poll():
                    if worker.receive(1.0)[0] == "beat":
                        entry["beats"] += 1
                        entry["last_beat_s"] = round(time.monotonic() - since, 2)
                if not worker.process.is_alive():
                    raise worker.death_error("while busy")
            except WorkerError as error:
                entry["ended"] = {"after_s": round(time.monotonic() - since, 2), "exitcode": worker.process.exitcode,
                                  "error": str(error)[-800:]}
        time.sleep(0.05)
    now = round(time.monotonic() - since, 2)
    for entry in status.values():
        if entry["ended"] is None:
            quiet = now - (entry["last_beat_s"] or 0.0)
            entry["state"] = "running" if entry["beats"] and quiet < 5.0 else f"alive, no beat for {quiet:.1f} s"
        else:
            entry["state"] = "ended"
    return status


def wait_for_beat(worker: Worker, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if worker.poll() and worker.receive(1.0)[0] == "beat":
            return True
        time.sleep(0.01)
    return False


def start(workers: dict[str, Worker], timeout: float) -> dict:
    """Starts workers one by one (Worker.start sets os.environ for the spawn: never in parallel)."""
    infos = {}
    for name, worker in workers.items():
        try:
            infos[name] = worker.start(timeout)
        except WorkerError as error:
            infos[name] = {"error": str(error)[-800:]}
    return infos


def stop(workers: dict[str, Worker]) -> None:
    for worker in workers.values():
        with contextlib.suppress(Exception):
            worker.stop(timeout=5.0)


def attached(info: dict, quota: int) -> bool | None:
    """Whether a client runs under its SM quota (None: cannot tell, e.g. an unknown GPU)."""
    total = 132 if any(k in info.get("kind", "") for k in ("H100", "H200")) else None
    if total is None or info.get("core_count") is None:
        return None
    return info["core_count"] == expected_sm_count(total, quota)


def mps_processes(daemon: MpsDaemon) -> dict[str, list[int]]:
    """pids of this daemon's control and server processes: by the private pipe folder in their
    environment, by parent, or named in its own control log."""
    wanted = f"CUDA_MPS_PIPE_DIRECTORY={daemon.pipe_dir}".encode()
    found: dict[str, list[int]] = {"control": [], "server": []}
    candidates = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                name = os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
            if name not in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server"):
                continue
            with open(f"/proc/{pid}/status") as f:
                ppid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
            with open(f"/proc/{pid}/environ", "rb") as f:
                ours = wanted in f.read().split(b"\0")
        except (OSError, StopIteration):
            continue
        candidates[int(pid)] = (name, ppid, ours)
        if ours:
            found["control" if name.endswith("control") else "server"].append(int(pid))
    logged = set()
    with contextlib.suppress(OSError), open(os.path.join(daemon.log_dir, "control.log")) as f:
        logged = {int(p) for p in re.findall(r"[Ss]erver (\d+)", f.read())}
    for pid, (name, ppid, ours) in candidates.items():
        if name.endswith("server") and not ours and (ppid in found["control"] or pid in logged):
            found["server"].append(pid)
    return found


def mps_control(daemon: MpsDaemon, command: str, timeout: float = 10.0) -> dict:
    """Sends one command to the daemon; whether it answered in time."""
    start = time.monotonic()
    try:
        result = subprocess.run([mps.CONTROL_BINARY], input=command + "\n", env=daemon._env(), capture_output=True,
                                text=True, timeout=timeout)
        return {"returncode": result.returncode, "output": (result.stdout + result.stderr).strip()[-300:],
                "seconds": round(time.monotonic() - start, 2)}
    except subprocess.TimeoutExpired:
        return {"returncode": None, "output": f"no answer within {timeout:.0f} s", "seconds": timeout}


def log_tails(daemon: MpsDaemon) -> dict:
    tails = {}
    for name in ("control.log", "server.log"):
        with contextlib.suppress(OSError), open(os.path.join(daemon.log_dir, name)) as f:
            tails[name] = f.read().splitlines()[-15:]
    return tails


def stop_daemon(daemon: MpsDaemon | None, record: dict) -> None:
    """`quit`, bounded; then SIGKILL whatever of this daemon is left after 15 s, and remove its folders."""
    if daemon is None or daemon.root is None:
        return
    record["mps_logs"] = log_tails(daemon)
    root = daemon.root
    try:
        daemon.stop()
    except subprocess.TimeoutExpired:
        record["daemon_quit"] = "quit did not answer within 30 s"
    daemon.root = root
    deadline = time.monotonic() + 15.0  # `quit` returns at once; the daemon then shuts down in order
    while any(mps_processes(daemon).values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftover = mps_processes(daemon)
    for pid in leftover["control"] + leftover["server"]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    if leftover["control"] or leftover["server"]:
        record["daemon_killed_at_cleanup"] = leftover
    shutil.rmtree(root, ignore_errors=True)
    daemon.root, daemon.running = None, False


@contextlib.contextmanager
def control_binary(path: str):
    """Fault injection: jaxrose.mps uses another control binary for a while."""
    saved = mps.CONTROL_BINARY
    mps.CONTROL_BINARY = path
    try:
        yield
    finally:
        mps.CONTROL_BINARY = saved


@contextlib.contextmanager
def mps_log_records():
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("jaxrose.mps")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


def case_mps_missing(lab: Lab) -> dict:
    result = {}
    with control_binary("nvidia-cuda-mps-control-absent"), mps_log_records() as logs:
        started = MpsDaemon().start()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            envs = mps.prepare_clients({"worker": QUOTA})
    result["binary_missing"] = {"daemon_started": started, "log_warnings": logs,
                                "prepare_clients_warnings": [str(w.message) for w in caught],
                                "worker_env_has_mps": "CUDA_MPS_PIPE_DIRECTORY" in envs["worker"]}
    with tempfile.TemporaryDirectory() as folder:
        fake = os.path.join(folder, "nvidia-cuda-mps-control")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho 'fault injection: the MPS control daemon refused to start' >&2\nexit 1\n")
        os.chmod(fake, 0o755)
        with control_binary(fake), mps_log_records() as logs:
            started = MpsDaemon().start()
        result["start_fails"] = {"daemon_started": started, "log_warnings": logs}
    workers = {"plain": lab.worker("plain", envs["worker"])}
    try:
        result["fallback_worker"] = {"info": start(workers, lab.args.start_timeout)["plain"],
                                     "after_start": watch(workers, 4.0)["plain"]}
    finally:
        stop(workers)
    fell_back = not any(r["daemon_started"] for r in (result["binary_missing"], result["start_fails"]))
    warned = all(r["log_warnings"] for r in (result["binary_missing"], result["start_fails"]))
    ran = result["fallback_worker"]["after_start"]["beats"] > 0
    result["verdict"] = ("fallback with a warning, work runs without MPS" if fell_back and warned and ran else
                         f"UNEXPECTED: fell back {fell_back}, warned {warned}, worker ran {ran}")
    return result


def case_client_killed(lab: Lab) -> dict:
    result: dict = {}
    daemon = lab.daemon()
    if daemon is None and not lab.dry_run:
        return {"verdict": "skipped: the MPS daemon did not start"}
    env = daemon.client_env(QUOTA) if daemon else {}
    workers = {name: lab.worker(name, env) for name in ("a", "b", "c")}
    try:
        infos = result["clients"] = start(workers, lab.args.start_timeout)
        result["attached"] = {n: attached(i, QUOTA) for n, i in infos.items()}
        if any("error" in i for i in infos.values()):
            result["verdict"] = "UNEXPECTED: a client did not start"
            return result
        result["before_kill"] = watch(workers, 3.0)
        if not wait_for_beat(workers["a"], 30.0):
            result["verdict"] = "UNEXPECTED: client a stopped beating before the kill"
            return result
        killed = time.monotonic()
        os.kill(workers["a"].process.pid, signal.SIGKILL)  # right after a beat: its next call is in flight
        after = result["after_kill"] = watch(workers, lab.args.watch, since=killed)
        if daemon:
            result["daemon_answers"] = mps_control(daemon, "get_server_list")
        newcomer = {"d": lab.worker("d", env)}
        result["new_client"] = {"info": start(newcomer, 60.0)["d"]}
        result["new_client"]["after_start"] = watch(newcomer, 4.0)["d"]
        workers.update(newcomer)
        others = all(after[n]["state"] == "running" for n in ("b", "c"))
        reported = after["a"]["ended"] is not None
        new_ok = result["new_client"]["after_start"]["beats"] > 0
        result["verdict"] = (f"killed client reported after {after['a']['ended']['after_s']} s; " if reported else
                             "UNEXPECTED: killed client not reported; ") + \
                            ("the other clients kept running; " if others else "OTHER CLIENTS STOPPED OR FAILED; ") + \
                            ("a new client ran" if new_ok else "A NEW CLIENT DID NOT RUN")
    finally:
        stop(workers)
        stop_daemon(daemon, result)
    return result


def case_server_killed(lab: Lab) -> dict:
    result: dict = {}
    daemon = lab.daemon()
    if daemon is None:
        return {"verdict": "skipped: the MPS daemon did not start"}
    workers = {name: lab.worker(name, daemon.client_env(QUOTA)) for name in ("a", "b")}
    try:
        result["clients"] = start(workers, lab.args.start_timeout)
        if any("error" in i for i in result["clients"].values()):
            result["verdict"] = "UNEXPECTED: a client did not start"
            return result
        result["before_kill"] = watch(workers, 3.0)
        processes = result["mps_processes"] = mps_processes(daemon)
        if not processes["server"]:
            result["verdict"] = "UNEXPECTED: no MPS server of this daemon found; nothing killed"
            return result
        killed = time.monotonic()
        for pid in processes["server"]:
            os.kill(pid, signal.SIGKILL)
        after = result["after_kill"] = watch(workers, lab.args.watch, since=killed)
        result["daemon_answers"] = mps_control(daemon, "get_server_list")
        newcomer = {"c": lab.worker("c", daemon.client_env(QUOTA))}
        result["new_client"] = {"info": start(newcomer, 60.0)["c"]}
        result["new_client"]["after_start"] = watch(newcomer, 4.0)["c"]
        workers.update(newcomer)
        ended = [after[n]["ended"]["after_s"] for n in ("a", "b") if after[n]["ended"]]
        states = {n: after[n]["state"] for n in ("a", "b")}
        result["verdict"] = (f"both clients ended (error or exit) within {max(ended)} s" if len(ended) == 2 else
                             f"NOT BOUNDED BY THE CLIENTS THEMSELVES: {states} after {lab.args.watch:.0f} s (the "
                             f"runtime's receive timeout is what ends such a wait)") + \
                            ("; a new client ran" if result["new_client"]["after_start"]["beats"] else
                             "; a new client did not run")
    finally:
        stop(workers)
        stop_daemon(daemon, result)
    return result


def case_control_killed(lab: Lab) -> dict:
    result: dict = {}
    daemon = lab.daemon()
    if daemon is None:
        return {"verdict": "skipped: the MPS daemon did not start"}
    workers = {"a": lab.worker("a", daemon.client_env(QUOTA))}
    try:
        result["clients"] = start(workers, lab.args.start_timeout)
        if any("error" in i for i in result["clients"].values()):
            result["verdict"] = "UNEXPECTED: a client did not start"
            return result
        result["before_kill"] = watch(workers, 3.0)
        processes = result["mps_processes"] = mps_processes(daemon)
        if not processes["control"]:
            result["verdict"] = "UNEXPECTED: the control daemon was not found; nothing killed"
            return result
        killed = time.monotonic()
        for pid in processes["control"]:
            os.kill(pid, signal.SIGKILL)
        after = result["after_kill"] = watch(workers, min(lab.args.watch, 10.0), since=killed)
        # What jaxrose does next: prepare_clients asks the daemon first, and every worker's SM count
        # is checked against its quota when it reports ready.
        result["daemon_alive_after_kill"] = daemon.alive()
        env = daemon.client_env(QUOTA)
        newcomer = {"b": lab.worker("b", env)}
        started = time.monotonic()
        info = start(newcomer, 60.0)["b"]
        total = 132 if any(k in info.get("kind", "") for k in ("H100", "H200")) else None
        result["new_client"] = {"info": info, "seconds": round(time.monotonic() - started, 2),
                                "attached": attached(info, QUOTA),
                                "jaxrose_attachment_check": attachment_problem(env, info, total) if total else None}
        workers.update(newcomer)
        flagged = result["new_client"]["jaxrose_attachment_check"] is not None
        new = ("failed: " + info["error"][:200] if "error" in info else
               ("ran WITHOUT MPS (full SM count), flagged by jaxrose's attachment check" if flagged else
                "ran silently WITHOUT MPS (full SM count), NOT FLAGGED") if result["new_client"]["attached"] is False
               else "attached")
        daemon_seen = ("daemon reported dead, so prepare_clients falls back with a warning" if
                       not result["daemon_alive_after_kill"] else "DAEMON STILL REPORTED ALIVE")
        result["verdict"] = f"running client: {after['a']['state']}; {daemon_seen}; new client {new}"
    finally:
        stop(workers)
        stop_daemon(daemon, result)
    return result


PLAN_SCRIPT = """
import sys
from jaxrose.graph import build_graph
from jaxrose.plan import defer, place, sequential_plan, split_chunk
from jaxrose.ppo_program import ITERATION_INPUTS
from jaxrose.presets import get_preset
from jaxrose.sequential import SequentialExecutor
program = SequentialExecutor(get_preset("point-mass")).program
graph = build_graph(program, ITERATION_INPUTS)
plan = split_chunk(sequential_plan(program), "iteration", "reduce_metrics")
defer(place(plan, "reduce_metrics", "helper"), program, graph, "reduce_metrics").save(sys.argv[1])
"""


def children_of(pid: int) -> dict[int, str]:
    found = {}
    for child in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{child}/status") as f:
                ppid = int(next(line for line in f if line.startswith("PPid:")).split()[1])
            if ppid == pid:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    found[int(child)] = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, StopIteration):
            continue
    return found


def iterations_logged(path: str) -> int:
    with contextlib.suppress(OSError), open(path) as f:
        return sum('"perf/sps"' in line for line in f)
    return 0


def case_train(lab: Lab, target: str) -> dict:
    """`jaxrose train` with a plan helper; SIGKILL `target` ('helper' or 'server') mid-run."""
    result: dict = {}
    daemon = lab.daemon()
    if daemon is None and not lab.dry_run:
        return {"verdict": "skipped: the MPS daemon did not start"}
    folder = tempfile.mkdtemp(prefix="jaxrose-faults-")
    process = None
    base_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    try:
        plan = os.path.join(folder, "plan.json")
        made = subprocess.run([sys.executable, "-c", PLAN_SCRIPT, plan], env={**base_env, "JAX_PLATFORMS": "cpu"},
                              capture_output=True, text=True, timeout=120)
        if made.returncode:
            return {"verdict": "UNEXPECTED: could not make the plan", "stderr": made.stderr[-1500:]}
        out = os.path.join(folder, "run")
        command = [sys.executable, "-m", "jaxrose.cli", "train", "--preset", "point-mass", "--run.plan", plan,
                   "--run.no-use-mps", "--run.total-env-steps", "2000000000", "--run.num-evals", "2",
                   "--run.checkpoint-every", "25", "--run.no-progress-bar", "--run.no-tensorboard",
                   "--run.out-dir", out]
        # Every process of the run is a client of this script's daemon (inherited environment), so
        # the script knows which server to kill; --run.no-use-mps keeps train from starting its own.
        env = {**base_env, **NO_PREALLOCATION, **lab.platform_env, **(daemon.client_env() if daemon else {})}
        result["command"] = " ".join(command[1:])
        # Output to files, not pipes: a trainer blocked on a full pipe would look like a hang.
        log = os.path.join(folder, "train.log")
        with open(log, "w") as sink:
            process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=folder)
        deadline = time.monotonic() + lab.args.start_timeout + 60
        metrics = os.path.join(out, "metrics.jsonl")
        while time.monotonic() < deadline and process.poll() is None and iterations_logged(metrics) < 30:
            time.sleep(0.5)
        result["iterations_before_kill"] = iterations_logged(metrics)
        if process.poll() is not None or result["iterations_before_kill"] < 30:
            with open(log) as f:
                result["output_tail"] = f.read()[-1500:]
            result["verdict"] = "UNEXPECTED: training did not get going"
            return result
        if target == "helper":
            victims = [pid for pid, cmd in children_of(process.pid).items() if "spawn_main" in cmd]
        else:
            victims = mps_processes(daemon)["server"]
        result["killed"] = {"target": target, "pids": victims}
        if not victims:
            result["verdict"] = f"UNEXPECTED: no {target} process found; nothing killed"
            return result
        killed = time.monotonic()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        try:
            process.wait(timeout=lab.args.exit_timeout)
            exited = round(time.monotonic() - killed, 2)
        except subprocess.TimeoutExpired:
            exited = None
            os.killpg(process.pid, signal.SIGKILL)  # the trainer's own session: it and its workers
            process.wait(timeout=30)
        with open(log) as f:
            stderr = f.read()
        errors = [line for line in stderr.splitlines() if line.startswith(("error:", "stopped:"))]
        checkpoints = os.path.join(out, "checkpoints")
        steps = sorted(int(p) for p in os.listdir(checkpoints) if p.isdigit()) if os.path.isdir(checkpoints) else []
        result.update({"exit_code": process.returncode, "exit_after_s": exited, "error_lines": errors,
                       "output_tail": stderr[-1500:],
                       # XLA's teardown logs (E... lines) bury the traceback: keep the Python lines too
                       "python_lines": [line for line in stderr.splitlines()
                                        if not line.startswith(("E1", "W1", "I1", "===", "external/"))][-40:], "checkpoint_steps": steps,
                       "latest_checkpoint_intact": bool(steps) and manifest.verify(
                           os.path.join(out, "checkpoints", str(steps[-1]))) is None})
        if exited is None:
            result["verdict"] = f"HANG: the trainer was still running {lab.args.exit_timeout:.0f} s after the kill; killed"
        else:
            clear = "WorkerError" in stderr or any("Worker" in line for line in errors)
            result["verdict"] = (f"exit code {process.returncode} {exited} s after the kill, "
                                 f"{'a clear worker error' if clear else 'no jaxrose error line (see output_tail)'}; "
                                 f"latest checkpoint {'intact' if result['latest_checkpoint_intact'] else 'NOT intact'}")
    finally:
        if process is not None and process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(process.pid, signal.SIGKILL)
        stop_daemon(daemon, result)
        shutil.rmtree(folder, ignore_errors=True)
    return result


RUNNERS = {"mps_missing": case_mps_missing, "client_killed": case_client_killed, "server_killed": case_server_killed,
           "control_killed": case_control_killed,
           "train_helper_killed": lambda lab: case_train(lab, "helper"),
           "train_server_killed": lambda lab: case_train(lab, "server")}
NEEDS = {"mps_missing": 40, "client_killed": 90, "server_killed": 110, "control_killed": 90,
         "train_helper_killed": 150, "train_server_killed": 200}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated, from: " + ", ".join(CASES))
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, without MPS: check the script itself")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds; later cases are skipped past it")
    parser.add_argument("--out", help="also write the JSON here, after every case (survives a hard kill)")
    parser.add_argument("--watch", type=float, default=20.0, help="seconds to watch clients after a kill")
    parser.add_argument("--start-timeout", type=float, default=180.0, help="seconds for a worker to get ready")
    parser.add_argument("--exit-timeout", type=float, default=150.0, help="seconds for the trainer to exit")
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(CASES)}")
    report = {"script": "gpu_faults", "gpus": gpu_count(), "mps": unavailable_reason() or "available",
              "dry_run": args.dry_run, "git_commit": os.environ.get("JAXROSE_GIT_COMMIT"), "cases": {},
              "verdicts": {}}
    began = time.monotonic()
    if report["gpus"] == 0 and not args.dry_run:
        report["skipped"] = "no NVIDIA GPU is present (NVML sees none): these cases need the GPU machine"
        print(save(report, began, args.out))
        return 0
    if args.dry_run:
        cases = [c for c in cases if c in DRY_RUN_CASES]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` still gets the cleanup and the JSON
    lab = Lab(args)
    try:
        for case in cases:
            left = args.budget - (time.monotonic() - began)
            if left < NEEDS[case]:
                report["cases"][case] = {"verdict": f"skipped: {left:.0f} s of the budget left, it needs ~{NEEDS[case]}"}
                continue
            start_case = time.monotonic()
            try:
                report["cases"][case] = RUNNERS[case](lab)
            except Exception:
                report["cases"][case] = {"verdict": "SCRIPT ERROR", "traceback": traceback.format_exc()[-3000:]}
            report["cases"][case]["seconds"] = round(time.monotonic() - start_case, 1)
            save(report, began, args.out)
    finally:
        print(save(report, began, args.out))
    return 0


def save(report: dict, began: float, path: str | None) -> str:
    report["seconds"] = round(time.monotonic() - began, 1)
    report["verdicts"] = {case: r.get("verdict") for case, r in report["cases"].items()}
    text = json.dumps(report, indent=2, default=str)
    if path:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return text


if __name__ == "__main__":
    sys.exit(main())
