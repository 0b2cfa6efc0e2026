"""On a machine of several GPUs (issue #9/#12): throughput of one training run on 1 GPU, on N GPUs as N
processes (one per GPU, pinned by LOCAL_RANK, `jax.distributed`), and on N GPUs in one process
(`run.devices N`), each a real `jaxrose train` with the same settings but its env count scaled by N
(4096 envs per GPU for ant-mlp; the PPO batch is unchanged, so an iteration's env steps stay the same
and each GPU steps its own envs for fewer unrolls).
Usage: python3 scripts/gpu_scale_check.py [PRESET] [--gpus=2] [--steps=N] [--modes=one,processes,devices]
[--out=PATH]. Reports each run's median steady steps/s (perf/sps after the first evaluation period),
final evaluation return and wall time, and the speed-up of every N-GPU run over the 1-GPU run."""

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from gpu_output import write_out  # scripts/ is on the path when a script runs


def _flag(name: str, default: str) -> str:
    return next((a.split("=", 1)[1] for a in sys.argv if a.startswith(f"--{name}=")), default)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _summary(out_dir: str, steady_after: int) -> dict:
    records = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
    sps = [r["perf/sps"] for r in records if "perf/sps" in r and r["step"] > steady_after]
    returns = [r["eval/episode_return"] for r in records if "eval/episode_return" in r]
    return {"median_steady_sps": statistics.median(sps) if sps else None, "iterations_timed": len(sps),
            "final_return": returns[-1] if returns else None}


def _launch(args: list[str], ranks: int, env_extra: dict) -> float:
    """Runs `jaxrose train ARGS` as `ranks` processes (one per GPU when ranks > 1); returns wall seconds."""
    start, port, children = time.perf_counter(), _free_port(), []
    for rank in range(ranks):
        env = {**os.environ, **env_extra}
        if ranks > 1:
            env.update(JAX_COORDINATOR_ADDRESS=f"localhost:{port}", JAX_NUM_PROCESSES=str(ranks),
                       JAX_PROCESS_ID=str(rank), LOCAL_RANK=str(rank))
        children.append(subprocess.Popen([sys.executable, "-m", "jaxrose.cli", "train", *args], env=env,
                                         stdout=subprocess.DEVNULL if rank else None, stderr=subprocess.STDOUT))
    codes = [child.wait(timeout=3000) for child in children]
    if any(codes):
        raise SystemExit(f"jaxrose train {' '.join(args)} exited with {codes}")
    return time.perf_counter() - start


def main() -> None:
    from jaxrose.presets import get_preset

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    preset = args[0] if args else "ant-mlp"
    gpus, modes = int(_flag("gpus", "2")), _flag("modes", "one,processes,devices").split(",")
    config = get_preset(preset)
    steps = int(_flag("steps", str(config.run.total_env_steps)))
    evals = _flag("num-evals", "3")
    per_eval = steps // (int(evals) - 1)
    common = ["--preset", preset, "--run.total-env-steps", str(steps), "--run.num-evals", evals,
              "--run.no-progress-bar", "--run.no-tensorboard"]
    root = tempfile.mkdtemp(prefix="jaxrose-scale-")
    scaled = ["--env.num-envs", str(config.env.num_envs * gpus), "--env.num-groups", str(gpus)]
    runs = {"one": (common, 1), "processes": (common + scaled, gpus),
            "devices": (common + scaled + ["--run.devices", str(gpus)], 1)}
    result = {"preset": preset, "gpus": gpus, "env_steps": steps, "runs": {}}
    for mode in modes:
        flags, ranks = runs[mode]
        out = os.path.join(root, mode)
        wall = _launch(flags + ["--run.out-dir", out], ranks, {})
        result["runs"][mode] = {"command": "jaxrose train " + " ".join(flags), "processes": ranks,
                                "wall_seconds": wall, **_summary(out, per_eval)}
        print(json.dumps({mode: result["runs"][mode]}), flush=True)
    one = result["runs"].get("one", {}).get("median_steady_sps")
    for mode, run in result["runs"].items():
        if one and run["median_steady_sps"] and mode != "one":
            run["speedup_over_one_gpu"] = run["median_steady_sps"] / one
            run["scaling_efficiency"] = run["speedup_over_one_gpu"] / gpus
    print(json.dumps(result))
    write_out(result)


if __name__ == "__main__":
    main()
