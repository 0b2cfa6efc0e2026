"""GPU check of the sampler's device state (SM clock, temperature, power, clock-limit reasons): idle,
then under a matmul load, each window's summary printed as JSON, and the provenance digest."""

import json
import time

import jax
import jax.numpy as jnp

from jaxrose.profiler import GpuActivitySampler
from jaxrose.provenance import source_digest

with GpuActivitySampler() as sampler:
    t0 = sampler.mark("idle/start")
    time.sleep(1.5)
    t1 = sampler.mark("idle/end")
    x = jnp.ones((8192, 8192), jnp.bfloat16)
    matmul = jax.jit(lambda a: (a @ a) * 1e-3)
    matmul(x).block_until_ready()
    t2 = sampler.mark("load/start")
    while time.perf_counter() - t2 < 3.0:
        for _ in range(20):
            x = matmul(x)
        x.block_until_ready()
    t3 = sampler.mark("load/end")
print(json.dumps({"available": sampler.available, "reason": sampler.reason, "idle": sampler.mean(t0, t1),
                  "load": sampler.mean(t2, t3), "last_sample": sampler.samples()[-1]._asdict() if sampler.samples()
                  else None, "source_digest": source_digest()}, indent=1))
