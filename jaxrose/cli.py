"""`jaxrose` command line: thin parsing over the library; settings come from the config dataclasses."""

from __future__ import annotations

import sys

USAGE = """usage: jaxrose COMMAND [options]

commands:
  train [--preset NAME] [--env.num-envs N ...]   train with PPO (default preset: pendulum)
  presets                                        list the named workloads
  bench [options]                                benchmark against brax PPO (see jaxrose bench --help)
  compare RESULTS_JSON ... [--threshold R]       several bench runs (seeds, settings) side by side
  plan [--preset NAME]                           measure an iteration, rank legal transformations, save a plan
  tune [--preset NAME] [--no-overlap ...]        keep only the transformations that measure faster
  ablate [--presets ...] [--arms ...] [--seeds]  tune and measure each optimization on and off, per seed
  lag-study [--preset NAME] [--lags 0 2 4 ...]   what a fixed policy lag costs per env step, per off-policy correction
  doctor                                         what this machine offers: GPUs, SMs, MPS, GPM, versions

Run `jaxrose train --help` for every setting.
"""


def _pop_preset(args: list[str]) -> tuple[str, list[str]]:
    from jaxrose.presets import DEFAULT_PRESET

    rest, preset = [], DEFAULT_PRESET
    i = 0
    while i < len(args):
        if args[i] == "--preset" and i + 1 < len(args):
            preset, i = args[i + 1], i + 2
        elif args[i].startswith("--preset="):
            preset, i = args[i].split("=", 1)[1], i + 1
        else:
            rest.append(args[i])
            i += 1
    return preset, rest


def train_main(args: list[str]) -> None:
    import tyro

    from jaxrose.config import TrainConfig
    from jaxrose.presets import get_preset
    from jaxrose.train import train

    preset, rest = _pop_preset(args)
    config = tyro.cli(TrainConfig, default=get_preset(preset), args=rest, prog=f"jaxrose train --preset {preset}")
    result = train(config)
    print(f"final evaluation return: {result.final_return:.4g}")
    print(f"outputs: {result.out_dir} (metrics.jsonl, learning_curve.png, checkpoints/)")


def presets_main(args: list[str]) -> None:
    import argparse

    from jaxrose.presets import PRESETS

    argparse.ArgumentParser(prog="jaxrose presets", description="List the named workloads (env, policy, "
                            "budget); train one with `jaxrose train --preset NAME`.").parse_args(args)
    for name, config in PRESETS.items():
        net = config.network
        policy = (f"transformer(depth={net.transformer_depth}, width={net.transformer_width}, history={net.history})"
                  if net.policy == "transformer" else f"mlp{tuple(net.policy_hidden)}")
        print(f"{name:24s} env={config.env.name} num_envs={config.env.num_envs} "
              f"steps={config.run.total_env_steps:,} policy={policy}")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return
    command, args = argv[0], argv[1:]
    from jaxrose.train import TerminatedError

    try:
        _dispatch(command, args)
    except _user_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except TerminatedError as error:
        print(f"stopped: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None
    except Exception as error:  # a lost GPU context outside the training loop's own handler
        from jaxrose.train import _device_lost

        if not (isinstance(error, jax_runtime_error()) and _device_lost(error)):
            raise
        print(f"error: the GPU context of this process failed ({str(error).splitlines()[0][:300]}); under MPS "
              f"this means the run's MPS server or daemon died. Checkpoints already written are intact: resume "
              f"in a fresh process with --run.resume (--run.no-use-mps trains without MPS).", file=sys.stderr)
        raise SystemExit(2) from None


def jax_runtime_error() -> type:
    import jax

    return jax.errors.JaxRuntimeError


def _user_errors() -> tuple[type[Exception], ...]:
    from envs.registry import UnknownEnvironmentError
    from jaxrose.checkpoint import CheckpointError
    from jaxrose.config import ConfigError
    from jaxrose.plan import PlanError
    from jaxrose.train import DeviceLostError, NonFiniteError
    from jaxrose.workers import WorkerError

    return (ConfigError, CheckpointError, UnknownEnvironmentError, PlanError, WorkerError, NonFiniteError,
            DeviceLostError)


# Each command's entry point, imported only when that command runs (they pull in heavy packages).
COMMANDS = {"train": "jaxrose.cli:train_main", "presets": "jaxrose.cli:presets_main", "tune": "jaxrose.tune:main",
            "ablate": "jaxrose.ablate:main", "lag-study": "jaxrose.lag_study:main",
            "plan": "jaxrose.plan_cli:main", "doctor": "jaxrose.doctor:main", "bench": "jaxrose.bench:main",
            "compare": "jaxrose.compare:main"}


def _dispatch(command: str, args: list[str]) -> None:
    import importlib

    if command not in COMMANDS:
        print(f"Unknown command {command!r}.\n\n{USAGE}", file=sys.stderr)
        raise SystemExit(2)
    module, function = COMMANDS[command].split(":")
    getattr(importlib.import_module(module), function)(args)


if __name__ == "__main__":
    main()
