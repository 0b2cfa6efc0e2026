#!/usr/bin/env bash
# First look at a GPU machine: versions, SM count, a short ant-mlp run, MPS attachment.
set -u
. scripts/gpu_setup.sh || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_mode --format=csv
python3 -c "import jax, brax, mujoco; d=jax.devices()[0]; print(jax.__version__, d.device_kind, 'SMs', d.core_count, 'brax', brax.__version__, 'mujoco', mujoco.__version__)"
out=${OUT:-/tmp/out}
jaxrose train --preset ant-mlp --run.total-env-steps 3300000 --run.num-evals 2 --run.no-progress-bar \
  --run.out-dir "$out/ant_smoke" --run.no-tensorboard 2>&1 | tail -3
python3 - "$out/ant_smoke/metrics.jsonl" <<'PY'
import json, sys, statistics
recs = [json.loads(l) for l in open(sys.argv[1])]
sps = [r["perf/sps"] for r in recs if "perf/sps" in r]
print("compile_s", [r["perf/compile_seconds"] for r in recs if "perf/compile_seconds" in r])
print("sps per iteration", [round(s) for s in sps])
print("median sps after first 2", round(statistics.median(sps[2:])))
print("eval walltime", [round(r["eval/walltime"], 2) for r in recs if "eval/walltime" in r])
PY
# MPS: private daemon, one client at 40%, SM count as the client's JAX sees it.
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
which nvidia-cuda-mps-control && nvidia-cuda-mps-control -d && echo "mps daemon started"
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40 python3 -c "import jax; print('SMs at 40%:', jax.devices()[0].core_count)"
echo quit | nvidia-cuda-mps-control; echo "mps stopped"
