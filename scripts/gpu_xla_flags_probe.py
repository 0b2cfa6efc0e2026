"""On a GPU: do XLA's command buffers (CUDA graphs) shorten the simulation, the actor's rollout or the learner's step?

The asynchronous learner's update on ant-mlp is 128 minibatch steps of small MLPs (4 epochs x 32 minibatches of
2,048 x 5 samples): ~0.6 ms each on an H100 (session 40), short enough for kernel launches to matter. The
simulation's scan over 80 steps launches many small kernels per step too. Which of a program's kernels XLA records
into CUDA graphs is set by `--xla_gpu_enable_command_buffer`'s types; whether a loop's body is among them by
default depends on the XLA release, so the variants measure command buffers off, the default, and the default with
WHILE and CONDITIONAL added. Each variant runs in its own process (XLA reads its flags once),
one after the other, on the same GPU; each times the three programs of `scripts/gpu_overlap_probe.py` (the
zero-action simulation scan, the actor's rollout of `--groups` groups and the learner's step on zeros) after a
warm-up, `REPEATS` runs each, and reports the medians, every run and the compile seconds apart.

Usage: python3 scripts/gpu_xla_flags_probe.py [PRESET] [REPEATS] [--groups=2] [--variants=NAME,...]
       [--programs=sim_flat_zero,actor,learner] [--variant-seconds=600] [--out=PATH]
       [-- TRAIN SETTINGS, e.g. --ppo.off-policy-correction vtrace]
A variant whose process runs past --variant-seconds is killed and recorded as an error; the next one runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

from gpu_output import write_out  # scripts/ is on the path when a script runs
from gpu_overlap_probe import actor_parts, learner_step_on_zeros, load_config, require_groups, split_args, timed

PROGRAMS = ("sim_flat_zero", "actor", "learner")

# Each variant's XLA flags (added to whatever XLA_FLAGS the caller set) and train settings (added to the caller's).
# The learner-unroll variants keep XLA's flags and run 4, then all 32, of ant-mlp's minibatch steps per iteration
# of the learner's device loop (run.learner_unroll): the same updates in fewer loop iterations.
VARIANTS = {
    "default": ("", ()),
    "no-command-buffers": ("--xla_gpu_enable_command_buffer=", ()),
    "loops-in-command-buffers": ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL", ()),
    "loops-any-size": ("--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL --xla_gpu_graph_min_graph_size=1", ()),
    "learner-unroll-4": ("", ("--run.learner-unroll", "4")),
    "learner-unroll-32": ("", ("--run.learner-unroll", "32")),
}


def measure(preset: str, train_args: list[str], groups: int, repeats: int, report_file: str,
            names: tuple[str, ...] = PROGRAMS) -> None:
    """In this process (its XLA flags already set): compile and time the named programs; write the report."""
    import jax

    config = load_config(preset, train_args)
    programs = {}
    if {"sim_flat_zero", "actor"} & set(names):
        parts = actor_parts(config, groups)
        programs.update(sim_flat_zero=parts["sim_flat_zero"], actor=parts["actor"])
    if "learner" in names:
        step, learner, unrolls = learner_step_on_zeros(config)
        programs["learner"] = (step, (learner, unrolls))
    env_steps = config.unrolls_per_iteration * config.ppo.unroll_length * groups * config.env.envs_per_group
    report = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "device": str(jax.devices()[0]), "env_steps": env_steps,
              "updates_per_rollout": groups / config.env.num_groups, "learner_unroll": config.run.learner_unroll,
              "compile_s": {}}
    for name in names:
        fn, args = programs[name]
        start = time.perf_counter()
        compiled = jax.jit(fn).lower(*args).compile()
        jax.block_until_ready(compiled(*args))
        report["compile_s"][name] = time.perf_counter() - start
        jax.block_until_ready(compiled(*args))  # warm-up past the first run
        report[name] = timed(compiled, args, repeats)
        print(name, f"{report[name]['median_s']:.4f} s", file=sys.stderr, flush=True)
    with open(report_file, "w") as f:
        json.dump(report, f)


def compare(result: dict) -> None:
    """Each measured variant's medians over the default's, per program (below 1: faster)."""
    default = result["variants"].get("default", {})
    for name, entry in result["variants"].items():
        if "error" in entry or "error" in default:
            continue
        entry["over_default"] = {p: entry[p]["median_s"] / default[p]["median_s"]
                                 for p in result["programs"] if p in entry and p in default}


def main() -> None:
    positional, options, train_args = split_args(sys.argv[1:])
    preset = positional[0] if positional else "ant-mlp"
    repeats = int(positional[1]) if len(positional) > 1 else 9
    groups = int(options.get("groups", 2))
    names = options.get("variants", ",".join(VARIANTS)).split(",")
    programs = options.get("programs", ",".join(PROGRAMS)).split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"--variants: unknown {', '.join(unknown)}; choose among {', '.join(VARIANTS)}.")
    unknown = [p for p in programs if p not in PROGRAMS]
    if unknown:
        sys.exit(f"--programs: unknown {', '.join(unknown)}; choose among {', '.join(PROGRAMS)}.")
    require_groups(load_config(preset, train_args), groups)  # here, not once per variant's process
    variant_seconds = float(options.get("variant-seconds", 600))
    result = {"git_commit": os.environ.get("JAXROSE_GIT_COMMIT"), "preset": preset, "train_args": train_args,
              "groups": groups, "repeats": repeats, "programs": programs,
              "base_xla_flags": os.environ.get("XLA_FLAGS", ""), "variants": {}}
    for name in names:
        report = os.path.join(tempfile.mkdtemp(), "report.json")
        variant_flags, variant_args = VARIANTS[name]
        flags = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), variant_flags) if f)
        env = {**os.environ, "XLA_FLAGS": flags, "PYTHONPATH": os.pathsep.join(sys.path)}
        started = time.perf_counter()
        try:
            child = subprocess.run([sys.executable, __file__, preset, str(repeats), f"--groups={groups}",
                                    f"--measure={report}", f"--programs={','.join(programs)}", "--", *train_args,
                                    *variant_args],
                                   env=env, capture_output=True, text=True, timeout=variant_seconds)
            error, stderr = (None if child.returncode == 0 and os.path.exists(report)
                             else f"exit code {child.returncode}"), child.stderr
        except subprocess.TimeoutExpired as expired:
            error = f"killed past --variant-seconds={variant_seconds:g}"
            stderr = expired.stderr or b""  # what it wrote before the kill, in bytes (subprocess's own contract)
            stderr = stderr.decode(errors="replace") if isinstance(stderr, bytes) else stderr
        if error is None:
            result["variants"][name] = json.load(open(report))
        else:
            result["variants"][name] = {"xla_flags": flags, "error": error, "stderr_tail": stderr[-2000:]}
        result["variants"][name]["variant_train_args"] = list(variant_args)
        result["variants"][name]["process_s"] = time.perf_counter() - started
        compare(result)
        print(name, json.dumps({k: v for k, v in result["variants"][name].items()
                                if k in ("over_default", "error", "compile_s")}), file=sys.stderr, flush=True)
        write_out(result)
    print(json.dumps({n: e.get("over_default", e.get("error")) for n, e in result["variants"].items()}))


if __name__ == "__main__":
    measuring = [a for a in sys.argv if a.startswith("--measure=")]
    if measuring:
        positional, options, train_args = split_args(sys.argv[1:])
        measure(positional[0], train_args, int(options.get("groups", 2)), int(positional[1]),
                measuring[0].split("=", 1)[1], tuple(options["programs"].split(",")))
    else:
        main()
