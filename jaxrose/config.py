"""Frozen, validated configuration: one dataclass per concern, one definition per setting.

The CLI (`jaxrose train`) is generated from these classes by tyro, so a setting is declared once.
Every check raises `ConfigError` with a sentence that names the field and the fix.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Optional


class ConfigError(ValueError):
    """A setting is invalid or inconsistent with another; the message says which and how to fix it."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """Which task, how many copies, and how they are laid out."""

    name: str = "pendulum"
    """Registered environment name (see `envs.names()`)."""
    num_envs: int = 256
    """Parallel training environments (all groups together)."""
    num_groups: int = 1
    """Environment groups: envs are laid out as [num_groups, num_envs // num_groups]."""
    episode_length: int = 200
    """Steps before an episode is truncated."""
    randomize: tuple[str, ...] = ()
    """Domain randomization of an MJX task's model, per env (see `envs.randomization`): any of
    friction, mass, actuator_gain."""

    def __post_init__(self):
        _require(self.num_envs >= 1, f"env.num_envs must be >= 1, got {self.num_envs}.")
        _require(self.num_groups >= 1, f"env.num_groups must be >= 1, got {self.num_groups}.")
        _require(self.num_envs % self.num_groups == 0,
                 f"env.num_envs ({self.num_envs}) must be divisible by env.num_groups ({self.num_groups}); "
                 f"pick num_groups among the divisors of num_envs.")
        _require(self.episode_length >= 1, f"env.episode_length must be >= 1, got {self.episode_length}.")
        if self.randomize:
            from envs.randomization import NAMES

            unknown = [name for name in self.randomize if name not in NAMES]
            _require(not unknown, f"env.randomize has unknown randomization(s) {', '.join(unknown)}; "
                                  f"known: {', '.join(NAMES)}.")
            _require(len(set(self.randomize)) == len(self.randomize),
                     f"env.randomize lists a randomization twice: {', '.join(self.randomize)}.")

    @property
    def envs_per_group(self) -> int:
        return self.num_envs // self.num_groups


@dataclasses.dataclass(frozen=True)
class NetworkConfig:
    """Policy and value networks (brax's PPO defaults), or an inference-heavy transformer policy."""

    policy_hidden: tuple[int, ...] = (32, 32, 32, 32)
    """MLP policy layer widths (wide values, e.g. 2048 2048 2048, make inference heavy)."""
    value_hidden: tuple[int, ...] = (256, 256, 256, 256, 256)
    activation: Literal["swish", "relu", "tanh", "elu"] = "swish"
    policy: Literal["mlp", "transformer"] = "mlp"
    """transformer: a causal transformer over the last `history` observations, standing in for the
    large policies of embodied RL."""
    history: int = 1
    """Observations the policy sees: the env group keeps the last `history` observations (oldest first)."""
    transformer_depth: int = 2
    transformer_width: int = 128
    transformer_heads: int = 4
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """The networks' matmuls and activations: bfloat16 runs them on the GPU's bf16 tensor cores (as large
    embodied policies are served); parameters, optimizer state, logits, log-probabilities and the loss
    stay float32."""

    def __post_init__(self):
        for field in ("policy_hidden", "value_hidden"):
            sizes = getattr(self, field)
            _require(len(sizes) >= 1 and all(s >= 1 for s in sizes),
                     f"network.{field} must be a non-empty list of positive layer widths, got {sizes}.")
        _require(self.history >= 1, f"network.history must be >= 1, got {self.history}.")
        for field in ("transformer_depth", "transformer_width", "transformer_heads"):
            _require(getattr(self, field) >= 1, f"network.{field} must be >= 1, got {getattr(self, field)}.")
        _require(self.compute_dtype in ("float32", "bfloat16"),
                 f"network.compute_dtype must be float32 or bfloat16, got {self.compute_dtype!r}.")
        _require(self.transformer_width % self.transformer_heads == 0,
                 f"network.transformer_width ({self.transformer_width}) must be divisible by "
                 f"network.transformer_heads ({self.transformer_heads}).")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyper-parameters, with brax's PPO meaning for every one of them."""

    learning_rate: float = 3e-4
    entropy_cost: float = 1e-2
    discounting: float = 0.97
    gae_lambda: float = 0.95
    clipping_epsilon: float = 0.3
    unroll_length: int = 10
    """Steps per unrolled trajectory segment; the loss sees [batch_size, unroll_length] segments."""
    batch_size: int = 64
    """Segments per minibatch."""
    num_minibatches: int = 8
    minibatch_segments: Optional[int] = None
    """None: every update's batch splits into `num_minibatches` minibatches (brax). A number: into
    minibatches of that many segments whatever the batch's size, so a larger batch takes more SGD
    steps and SGD steps per env step stay fixed (the asynchronous mode sets it when its resource
    manager grows batches; see `run.resources.grow_keeps`)."""
    num_updates_per_batch: int = 4
    """Epochs over the collected batch per iteration."""
    normalize_observations: bool = True
    reward_scaling: float = 1.0
    normalize_advantage: bool = True
    vf_loss_coefficient: float = 0.5
    max_grad_norm: Optional[float] = None
    max_off_policy_weight: float = 1.0
    """Truncation of the importance weight between the proximal and a stale behaviour policy
    (asynchronous mode only; V-trace's rho-bar)."""
    off_policy_correction: Literal["decoupled", "vtrace", "behaviour"] = "decoupled"
    """How the loss treats a batch collected with older parameters (asynchronous mode; identical at
    lag 0). `decoupled` (default): the trust region around the proximal policy, the stale gap
    corrected by a truncated importance weight (Hilton et al. 2022). `vtrace`: the same, and the
    value targets and advantages built with V-trace's truncated traces (Espeholt et al. 2018).
    `behaviour`: the stale batch taken as if on-policy, PPO clipped around the behaviour policy
    (an ablation; `jaxrose lag-study` measures the three)."""
    bootstrap_on_truncation: bool = False
    """False: truncated steps are masked out of GAE (brax's default). True: the value of the
    observation reached at truncation is added to the last reward, so time limits are not treated
    as failures."""

    def __post_init__(self):
        positive = ("learning_rate", "unroll_length", "batch_size", "num_minibatches", "num_updates_per_batch")
        for field in positive:
            _require(getattr(self, field) > 0, f"ppo.{field} must be > 0, got {getattr(self, field)}.")
        _require(0.0 <= self.discounting <= 1.0, f"ppo.discounting must lie in [0, 1], got {self.discounting}.")
        _require(0.0 <= self.gae_lambda <= 1.0, f"ppo.gae_lambda must lie in [0, 1], got {self.gae_lambda}.")
        _require(self.max_off_policy_weight > 0,
                 f"ppo.max_off_policy_weight must be > 0, got {self.max_off_policy_weight}.")
        _require(self.clipping_epsilon > 0, f"ppo.clipping_epsilon must be > 0, got {self.clipping_epsilon}.")
        _require(self.minibatch_segments is None or self.minibatch_segments > 0,
                 f"ppo.minibatch_segments must be > 0 or unset, got {self.minibatch_segments}.")
        _require(self.max_grad_norm is None or self.max_grad_norm > 0,
                 f"ppo.max_grad_norm must be > 0 or unset, got {self.max_grad_norm}.")

    @property
    def segments_per_iteration(self) -> int:
        return self.batch_size * self.num_minibatches


@dataclasses.dataclass(frozen=True)
class ResourceConfig:
    """The asynchronous mode's resource manager (`jaxrose.resources`): SM quotas and CPU cores of
    the actor and learner processes, rebalanced from runtime measurements."""

    manager: Literal["off", "on"] = "off"
    interval: float = 2.0
    """Seconds between two decisions (each one sees the measurements of the last interval). With
    ant's ~0.3 s updates 2 s is ~6 updates; at 5 s the first growth came 2/3 into a 30M-step run
    on the H200 (BENCHMARKS.md, 2026-12-03)."""
    sm_levels: tuple[int, ...] = (25, 50, 75, 100)
    """MPS quota levels (SM %) an actor may get; a change restarts the actor (warm with run.compile_cache)."""
    sm_pool: int = 100
    """Actors' quotas sum to at most this; the learner (the controller process, uncapped) uses the rest."""
    learner_cores: int = 1
    """CPU cores pinned to the learner at start; the other cores of this process's set go to the actors."""
    starve_fraction: float = 0.3
    """The learner waiting this share of an interval or more for trajectories: actors are the bottleneck."""
    queue_fraction: float = 0.5
    """Mean trajectories already waiting when the learner becomes free, at or above this share of the
    actors (and no starving): the learner is the bottleneck."""
    slow_ratio: float = 1.5
    """An actor whose rollouts take this many times the others' median is a straggler."""
    patience: int = 2
    """Consecutive intervals a signal must persist before the manager acts on it."""
    cooldown: int = 2
    """Intervals after a change during which no other change is made (its effect is measured first)."""
    group_levels: tuple[int, ...] = ()
    """Per-actor batch sizes the manager may choose, in env groups per actor: an actor at level g
    steps g * env.num_envs / env.num_groups envs and sends trajectories of that many groups. Must
    include the starting size env.num_groups / run.actors. Empty: batch sizes stay fixed."""
    warm_restarts: bool = True
    """A quota change starts the actor's new process beside the old one, which keeps rolling out
    until the new one has compiled its rollout; then they switch. False: stop the old process, then
    start the new one and compile its rollout with the learner waiting (28.99 s and 18.83 s per
    restart on the H200, plus a 26.9 s first rollout; BENCHMARKS.md, 2026-12-04)."""
    start_groups: int = 0
    """Env groups each actor steps from the first rollout, one of `group_levels` (0: the starting
    batch env.num_groups / run.actors). Updates keep the starting batch's size (grow_keeps), so a
    larger start means more envs per rollout, not a larger PPO batch; the manager may still grow or
    shrink from there. Growing from the starting batch takes the compile-ahead and the probation of
    every level (~24 s and 2 decisions per level on ant, BENCHMARKS.md, 2026-12-03): where the
    device is known to have room, starting there spends that time training."""
    grow_gain: float = 1.2
    """A grown batch stays only if the env groups the learner learns per second rose by this factor;
    otherwise it shrinks back and stays there (the device, or the learner, had no room for more envs)."""
    grow_keeps: Literal["update_size", "minibatch_size", "minibatch_count"] = "update_size"
    """What the learner keeps when an actor's batch is resized. 'update_size': the starting batch
    per update: a trajectory grown 4x is learned as 4 updates, one after another, each on a quarter
    of its groups with its own proximal policy (PPO's trust region per update, so updates per env
    step stay as configured; the later quarters are older data: run.max_policy_lag must be at least
    (run.actor_run_ahead + 1) x actors x 4 - 1, checked at start). 'minibatch_size': one update with the starting minibatch's
    size, so 4x the SGD steps in one trust region. 'minibatch_count': one update with
    ppo.num_minibatches, larger minibatches (4x fewer SGD steps per env step). Measured on the H200
    (BENCHMARKS.md, 2026-12-03): 'update_size' learns as much per env step as brax's PPO; a grown
    batch under 'minibatch_size' learned about a third as much."""
    lag_target: Optional[float] = None
    """The mean policy lag (in updates) batch growth may reach. With grow_keeps='update_size' a
    trajectory of g groups is learned as g / u updates (u: the starting groups per update), so a
    bigger batch is older data: one actor one rollout ahead sees lags g/u to 2g/u - 1, a mean of
    1.5 g/u - 0.5 (measured on ant: 1, 2.5 and 5.5 at 1, 2 and 4 groups; BENCHMARKS.md, session 32).
    Set, the manager grows a batch only where the lag so predicted from the measured one stays within
    it, and a measured mean lag above it shrinks the largest batch. None: growth is judged on the
    learner's wait alone (a lag of 6 cost ant 38% of its final return with the decoupled loss and
    19% with V-trace targets in `jaxrose lag-study`, session 31)."""

    def __post_init__(self):
        _require(self.interval > 0, f"run.resources.interval must be > 0 seconds, got {self.interval}.")
        levels = self.sm_levels
        _require(len(levels) >= 1 and all(1 <= v <= 100 for v in levels) and list(levels) == sorted(set(levels)),
                 f"run.resources.sm_levels must be increasing percentages in [1, 100], got {levels}.")
        _require(levels[0] <= self.sm_pool <= 100,
                 f"run.resources.sm_pool must lie in [{levels[0]}, 100] (the lowest level to 100), got {self.sm_pool}.")
        _require(self.learner_cores >= 1, f"run.resources.learner_cores must be >= 1, got {self.learner_cores}.")
        _require(0 < self.starve_fraction < 1,
                 f"run.resources.starve_fraction must lie in (0, 1), got {self.starve_fraction}.")
        _require(self.queue_fraction > 0, f"run.resources.queue_fraction must be > 0, got {self.queue_fraction}.")
        _require(self.slow_ratio > 1, f"run.resources.slow_ratio must be > 1, got {self.slow_ratio}.")
        _require(self.patience >= 1, f"run.resources.patience must be >= 1, got {self.patience}.")
        _require(self.cooldown >= 0, f"run.resources.cooldown must be >= 0, got {self.cooldown}.")
        groups = self.group_levels
        _require(all(g >= 1 for g in groups) and list(groups) == sorted(set(groups)),
                 f"run.resources.group_levels must be increasing env group counts >= 1, got {groups}.")
        _require(self.grow_gain >= 1, f"run.resources.grow_gain must be >= 1, got {self.grow_gain}.")
        _require(self.lag_target is None or self.lag_target >= 0,
                 f"run.resources.lag_target must be >= 0 updates (or None: lag not priced), got {self.lag_target}.")
        _require(self.lag_target is None or self.grow_keeps == "update_size",
                 f"run.resources.lag_target prices the staleness of a batch learned as several updates, which "
                 f"only grow_keeps='update_size' does (with {self.grow_keeps!r} the lag does not depend on the "
                 f"batch): set run.resources.grow_keeps update_size or drop run.resources.lag_target.")
        _require(self.start_groups >= 0, f"run.resources.start_groups must be >= 0 (0: env.num_groups / run.actors), "
                                         f"got {self.start_groups}.")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Budget, evaluation schedule, seed, outputs."""

    total_env_steps: int = 1_000_000
    num_evals: int = 6
    """Evaluations in the whole run, the first before training (brax's `num_evals`)."""
    num_eval_envs: int = 128
    deterministic_eval: bool = True
    """Evaluate with the policy's mode instead of sampling."""
    seed: int = 0
    out_dir: str = "runs/latest"
    """Where metrics.jsonl, TensorBoard events, checkpoints and learning_curve.png go."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many iterations (0: only at each evaluation and at the end)."""
    keep_checkpoints: int = 3
    """Newest checkpoints kept; resuming falls back to an older one if the newest is damaged."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """NaN or Inf in an iteration (observations, rewards, losses, parameters). stop: the run stops
    naming the stage. skip: that iteration's update is dropped, with a warning (`jaxrose.nonfinite`)."""
    max_consecutive_skips: int = 3
    """With on_nonfinite='skip': the run stops after this many skipped iterations in a row."""
    resume: Optional[str] = None
    """Resume from the latest checkpoint in this run folder."""
    tensorboard: bool = True
    progress_bar: bool = True
    eval_mode: Literal["inline", "process"] = "inline"
    """inline: evaluate between iterations, as brax does. process: evaluate in a separate process
    (an MPS client on a GPU) with the params of iteration k while training continues."""
    eval_sm_percentage: Optional[int] = None
    """SM quota of the evaluation process under MPS (None: no cap)."""
    learner_sm_percentage: Optional[int] = None
    """SM quota of the training process itself under MPS (the learner in asynchronous mode), fixed at
    start; it takes effect where the run starts worker processes under MPS (asynchronous mode, an
    evaluation process, a plan with helpers). Capping the learner leaves SMs to actors beside it."""
    unroll_rollout_steps: bool = False
    """Unroll the rollout's per-step loop (`ppo.unroll_length` steps of policy and env) into
    straight-line code, leaving one device loop (over unrolls) instead of two nested ones. Same
    results; a longer compile. For GPUs, where entering a device loop has a cost of its own
    (`scripts/gpu_actor_probe.py` measures both shapes)."""
    learner_unroll: int = 1
    """SGD steps per device-loop iteration of the learner's minibatch loop (`lax.scan`'s unroll): the
    same updates in fewer loop iterations. For GPUs, where each iteration of a device loop costs time
    beside its kernels (`scripts/gpu_xla_flags_probe.py` times it); a longer compile. At or above the
    minibatch count, the loop becomes straight-line code. On an H100, 4 and 32 made ant-mlp's learner
    step 6% slower (BENCHMARKS.md, session 42), hence the default of 1."""
    learner_priority: Literal["normal", "below-normal"] = "normal"
    """MPS scheduling priority of the training process itself, fixed at start like its quota: at
    below-normal its kernels run only when no normal client's are ready (asynchronous mode: the
    learner yields to the actors' rollouts, which set the pace)."""
    eval_priority: Literal["normal", "below-normal"] = "normal"
    """MPS scheduling priority of the evaluation process (run.eval_mode='process'): below-normal lets
    evaluation fill gaps instead of slowing the training beside it."""
    use_mps: bool = True
    """Use a private MPS daemon for worker processes when the machine offers one."""
    mode: Literal["sync", "async"] = "sync"
    """sync: every update uses data from the current parameters (Rose keeps this exact). async:
    env groups roll out in `actors` processes on their own, with a policy lag of at most
    `max_policy_lag` updates (EBRL)."""
    actors: int = 2
    max_policy_lag: int = 1
    actor_run_ahead: int = 1
    """Asynchronous mode: rollouts an actor may start before the learner has consumed its previous
    trajectory, with the newest parameters it has (0: each actor waits for the update of its own
    trajectory). Run-ahead hides the learner behind the rollouts; it is capped at max_policy_lag,
    since a rollout started ahead is consumed at least one update after its parameters."""
    actor_timeout: float = 300.0
    """Asynchronous mode: seconds the learner waits for an awaited rollout or state before it stops
    the run naming the silent actors (a first compile inside a rollout counts)."""
    resources: ResourceConfig = ResourceConfig()
    """The asynchronous mode's resource manager (off by default)."""
    devices: int = 1
    """Local devices per process to spread env groups over (data parallel: env state sharded by
    group, gradients reduced by XLA's collectives). env.num_groups must be a multiple of run.devices
    times the number of processes."""
    coordinator_address: Optional[str] = None
    """host:port of process 0 for a run over several processes (`jax.distributed`); else
    JAX_COORDINATOR_ADDRESS, or SLURM's under srun (see `jaxrose.distributed`)."""
    num_processes: Optional[int] = None
    """Processes in the run (one per host, or one per GPU); else JAX_NUM_PROCESSES, or SLURM's."""
    process_id: Optional[int] = None
    """This process's rank in [0, num_processes); else JAX_PROCESS_ID, or SLURM's."""
    local_gpu: Optional[int] = None
    """The GPU (index on this host) this process and its worker set use when several processes share
    a host: it is pinned there (CUDA_VISIBLE_DEVICES) before its GPU starts, so its private MPS daemon
    serves that GPU alone and its workers (the evaluator) run beside it. Default in a run of several
    processes: the launcher's local rank (LOCAL_RANK, SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK)."""
    compile_cache: Optional[str] = None
    """Folder for XLA's persistent compilation cache, shared with every worker process, so that
    workers (re)start without compiling again (e.g. to change an MPS quota). None: off."""
    plan: Optional[str] = None
    """A plan file (JSON, from `Plan.save` or the planner) to run instead of the sequential schedule."""

    def __post_init__(self):
        _require(self.total_env_steps > 0, f"run.total_env_steps must be > 0, got {self.total_env_steps}.")
        _require(self.num_evals >= 1, f"run.num_evals must be >= 1, got {self.num_evals}.")
        _require(self.num_eval_envs >= 1, f"run.num_eval_envs must be >= 1, got {self.num_eval_envs}.")
        _require(self.checkpoint_every >= 0, f"run.checkpoint_every must be >= 0, got {self.checkpoint_every}.")
        _require(self.eval_sm_percentage is None or 1 <= self.eval_sm_percentage <= 100,
                 f"run.eval_sm_percentage must be a percentage in [1, 100], got {self.eval_sm_percentage}.")
        _require(self.learner_sm_percentage is None or 1 <= self.learner_sm_percentage <= 100,
                 f"run.learner_sm_percentage must be a percentage in [1, 100], got {self.learner_sm_percentage}.")
        _require(self.devices >= 1, f"run.devices must be >= 1, got {self.devices}.")
        _require(self.learner_unroll >= 1, f"run.learner_unroll must be >= 1, got {self.learner_unroll}.")
        _require(self.actors >= 1, f"run.actors must be >= 1, got {self.actors}.")
        _require(self.max_policy_lag >= 0, f"run.max_policy_lag must be >= 0, got {self.max_policy_lag}.")
        _require(self.actor_run_ahead >= 0, f"run.actor_run_ahead must be >= 0, got {self.actor_run_ahead}.")
        _require(self.actor_timeout > 0, f"run.actor_timeout must be > 0 seconds, got {self.actor_timeout}.")
        _require(self.resources.manager == "off" or self.mode == "async",
                 "run.resources.manager='on' needs run.mode='async' (it rebalances actor and learner processes).")
        _require(self.keep_checkpoints >= 1, f"run.keep_checkpoints must be >= 1, got {self.keep_checkpoints}.")
        _require(self.on_nonfinite in ("stop", "skip"),
                 f"run.on_nonfinite must be 'stop' or 'skip', got {self.on_nonfinite!r}.")
        _require(self.max_consecutive_skips >= 1,
                 f"run.max_consecutive_skips must be >= 1, got {self.max_consecutive_skips}.")
        _require(self.num_processes is None or self.num_processes >= 1,
                 f"run.num_processes must be >= 1, got {self.num_processes}.")
        _require(self.process_id is None or 0 <= self.process_id < (self.num_processes or self.process_id + 1),
                 f"run.process_id must lie in [0, run.num_processes), got {self.process_id} of {self.num_processes}.")
        _require(self.local_gpu is None or self.local_gpu >= 0, f"run.local_gpu must be >= 0, got {self.local_gpu}.")
        _require(self.local_gpu is None or self.devices == 1,
                 f"run.local_gpu pins this process to one GPU, but run.devices is {self.devices}: leave run.local_gpu "
                 f"unset to use {self.devices} GPUs in this process, or set run.devices 1.")
        _require(self.coordinator_address is None or _is_host_port(self.coordinator_address),
                 f"run.coordinator_address must be host:port (e.g. 10.0.0.1:1234), got {self.coordinator_address!r}.")
        if (self.num_processes or 1) > 1:
            # Only the sequential executor shards over processes; the evaluator may run beside process 0.
            _require(self.mode == "sync", SEVERAL_PROCESSES)


SEVERAL_PROCESSES = ("Several processes (run.num_processes > 1) need run.mode='sync': the asynchronous mode's actors "
                     "and learner run on one process's GPU.")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs."""

    env: EnvConfig = EnvConfig()
    network: NetworkConfig = NetworkConfig()
    ppo: PPOConfig = PPOConfig()
    run: RunConfig = RunConfig()

    def __post_init__(self):
        segments, num_envs = self.ppo.segments_per_iteration, self.env.num_envs
        _require(segments % num_envs == 0,
                 f"ppo.batch_size * ppo.num_minibatches ({self.ppo.batch_size} * {self.ppo.num_minibatches} "
                 f"= {segments}) must be a multiple of env.num_envs ({num_envs}): every env contributes the "
                 f"same number of unrolls per iteration. Change ppo.batch_size or env.num_envs.")
        size = self.ppo.minibatch_segments
        if size is not None and self.run.mode == "sync":  # the asynchronous mode checks its own batch sizes
            _require(size <= segments and segments % size == 0,
                     f"ppo.minibatch_segments ({size}) must divide an iteration's {segments} segments "
                     f"(ppo.batch_size * ppo.num_minibatches): set it to a divisor of {segments}, or unset it.")
        self._check_devices()

    def _check_devices(self) -> None:
        self.check_devices(self.run.num_processes or 1)

    def check_devices(self, num_processes: int) -> None:
        """Every device of every process holds whole env groups (the count is known once the processes joined)."""
        total = self.run.devices * num_processes
        across = f" times {num_processes} processes" if num_processes > 1 else ""
        _require(self.env.num_groups % total == 0,
                 f"env.num_groups ({self.env.num_groups}) must be a multiple of run.devices ({self.run.devices}){across}: "
                 f"each device holds whole env groups. Set env.num_groups to a multiple of {total}.")

    @property
    def unrolls_per_iteration(self) -> int:
        """Sequential unroll segments each env runs per iteration (brax's inner scan length)."""
        return self.ppo.segments_per_iteration // self.env.num_envs

    @property
    def env_steps_per_iteration(self) -> int:
        return self.ppo.segments_per_iteration * self.ppo.unroll_length

    @property
    def iterations_per_eval(self) -> int:
        """brax's `num_training_steps_per_epoch`: iterations between two evaluations."""
        evals_after_init = max(self.run.num_evals - 1, 1)
        return -(-self.run.total_env_steps // (evals_after_init * self.env_steps_per_iteration))

    @property
    def num_iterations(self) -> int:
        return self.iterations_per_eval * max(self.run.num_evals - 1, 1)


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()


def replace(config, **changes):
    """`dataclasses.replace` that also accepts dotted paths: replace(cfg, **{"env.num_envs": 8})."""
    nested: dict[str, dict] = {}
    flat = {}
    for key, value in changes.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            flat[key] = value
    for head, sub in nested.items():
        flat[head] = replace(getattr(config, head), **sub)
    return dataclasses.replace(config, **flat)
