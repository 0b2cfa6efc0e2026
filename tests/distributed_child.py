"""One process of the two-process test run (tests/test_distributed.py): trains from a config file and
saves this process's copy of the final parameters.

usage: python distributed_child.py CONFIG_PICKLE OUT_NPZ. The coordinator, process count and rank come
from JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID, the devices from JAX_NUM_CPU_DEVICES.
"""

import os
import pickle
import sys

import jax
import numpy as np

from jaxrose.distributed import local_copy
from jaxrose.train import train


def flat(tree) -> dict:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


if __name__ == "__main__":
    with open(sys.argv[1], "rb") as f:
        result = train(pickle.load(f))
    leaf = jax.tree.leaves(result.state.env_state)[0]
    np.savez(sys.argv[2], process_count=jax.process_count(), global_devices=len(leaf.sharding.device_set),
             local_groups=leaf.addressable_shards[0].data.shape[0],
             final_return=result.final_return, eval_returns=[e["eval/episode_return"] for e in result.evaluations],
             visible_gpus=os.environ.get("CUDA_VISIBLE_DEVICES", ""),
             evaluator_visible_gpus=str(result.eval_worker.get("visible_gpus", "")),
             **flat(local_copy(result.params)))
