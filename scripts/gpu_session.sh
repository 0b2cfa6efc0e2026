#!/usr/bin/env bash
# The measurements a GPU session owes BENCHMARKS.md, each stage bounded so one call fits the lease.
# Usage on the device machine: JAXROSE_GIT_COMMIT=<sha> bash scripts/gpu_session.sh STAGE
# (bench results also record a digest of the sources that ran: `python -m jaxrose.provenance REV` gives a commit's)
# One stage per device call: a call brings back at most 8 files from $OUT.
#   mps     MPS attachment per quota and transport costs (~1 min)
#   paths   the GPU paths CPU tests only model: CUDA IPC per leaf dtype (bfloat16 included), the NVML device the
#           sampler opens per CUDA_VISIBLE_DEVICES form, jax.distributed's local devices (scripts/gpu_paths_check.py, ~1-2 min)
#   ant     ant-mlp, brax's full 50M-step schedule: brax, sim ceiling, sequential (~6 min)
#   ovl     ant-mlp, 50M steps, evaluation overlapped in an MPS process (~3 min)
#   ovl-prio  ant-mlp 10M, the overlapped system with its evaluator at normal and at below-normal priority (~5 min)
#   unroll  [PRESET]: the sequential system with run.unroll_rollout_steps false, then true (~5 min)
#   tfm     pusher-transformer: sim ceiling, sequential, overlapped, 10M steps (~4 min)
#   spread  PRESET STEPS: sim ceiling, sequential, rollout groups spread over 2 MPS processes
#           (pusher-transformer 5M: sim + sequential alone took ~6.5 min; give spread its own call:
#            `python3 scripts/gpu_spread_check.py pusher-transformer 3 --spread-only`, > 3 min)
#   async   [LEARNER_SM%]: ant-mlp 10M steps, 4 evaluations: brax, sim, sequential and async (1 actor of 4096 envs,
#           run-ahead 1, lag <= 1; the learner capped at LEARNER_SM% if given), started with bg: ~10 min in all, so
#           follow it at once with `collect async` (it needs two calls)
#   grow    [STEPS] [LEVELS]: #8's time-to-threshold: brax and the async system with its resource manager free to
#           grow each actor's batch among LEVELS env groups of 4096 (default 1,2,4), 30M steps, 6 evaluations;
#           started with bg (~6-7 min): follow with `collect grow`; GROW_ARGS adds train settings (e.g.
#           "--run.resources.grow-keeps update_size --run.max-policy-lag 7"), GROW_BENCH_ARGS bench settings
#           (e.g. "--return-threshold 3000")
#   growfix [STEPS] [SEED] [STARTS]: the time-to-threshold with V-trace targets (CORRECTION) in one detached chain on
#           one machine: async started at each of STARTS env groups (default "1 2 4"; 1 is grown from one group), brax
#           beside the first; GROWFIX_ARGS adds train settings (e.g. "--run.resources.lag-target 3")
#           (50M: ~4 min a run, `growfix; collect growfix 560`, then `collect growfix`)
#   lagstudy [PRESET] [LAGS] [SEEDS]: jaxrose lag-study (fixed policy lags x off-policy corrections; LAG_ARGS adds
#           lag-study options, e.g. "--corrections vtrace"; LAG_TRAIN_ARGS train settings, e.g.
#           "--ppo.num-updates-per-batch 8"); ant-mlp's
#           default (lags 0 4 8, seed 1) is ~7 runs of 50M steps: `bgstage lagstudy lagstudy; collect lagstudy 570`
#   lagseeds [PRESET] [LAGS] [SEEDS]: the same with each seed (default 1 2) a detached process beside the others:
#           `lagseeds; collect lag1 570; collect lag2 60`
#   bf16    [PRESET]: pusher-transformer with bfloat16 networks: sequential and async (bg, ~7.5 min: `bf16; collect bf16 560`)
#   fp32    [PRESET]: the float32 sequential system at bf16's settings (~4 min)
#   async-only [LEARNER_SM%] [EVAL_SM%]: the async system and the sim ceiling alone (after `async`, whose
#           compile cache it reuses), with the learner and the evaluator capped if given (~4 min)
#   async-actors [N]: the async system with N actors (default 2) splitting the 4096 envs (~2-3 min);
#           SYSTEMS=async,sim adds the sim ceiling (4096 envs, one process) measured on the same machine
#   async-solo: the async system with lag 0 and no run-ahead, so no rollout overlaps an update: the actor's own
#           rollout time with the learner idle, to set against `async`'s (~4 min)
#   ablate  [PRESET] [ARMS]: jaxrose ablate (ARMS a comma list; default sequential,all,no-overlap,no-groups,no-quotas),
#           3 timed iterations per measurement, 2 structural candidates per arm, the shared compile cache;
#           the table is rewritten after every arm, so a cut run keeps what it measured
#   priority  ant-mlp async at MPS priorities learner:evaluator normal:normal, below-normal:below-normal,
#           normal:below-normal, normal:normal again, then the sim ceiling (~6 min with a warm compile cache)
#   xlaflags [PRESET] [GROUPS] [VARIANTS] [PROGRAMS]: sim scan, actor rollout and learner step timed per XLA command-buffer
#           variant or learner unroll (run.learner_unroll 4, 32), each in its own process (scripts/gpu_xla_flags_probe.py;
#           ~1 min a variant with a warm cache)
#   actor   [PRESET] [alone]: where the async actor's rollout time goes (scripts/gpu_actor_probe.py; ~4 min;
#           with `alone`, without the runs beside a learner process, ~2 min)
#   probe   [PRESET]: where the tuned plan's gain comes from (scripts/gpu_plan_probe.py), with and without this
#           process joining MPS (~4 min for ant-mlp)
#   probe-companion [PRESET]: the probe without MPS, plus the sequential plan beside a second CUDA context that
#           is idle or ticks like the helper: does any second context shorten the iteration? (~5 min)
#   scale   [PRESET] [GPUS] [STEPS]: on a machine of several GPUs (nvidia-h200-x2 and up): one training run on 1 GPU,
#           on GPUS pinned processes and on GPUS devices of one process, 4096 envs per GPU for ant-mlp
#           (scripts/gpu_scale_check.py; ~3 min per run at 10M steps)
#   tune    [PRESET]: jaxrose tune alone (evaluation placement included), ~5-9 min: bring back plan.json, commit it,
#           then `TUNED_SYSTEMS=brax,sequential,tuned bash scripts/gpu_session.sh tuned PRESET 15000000 PLAN` (~6 min)
#   plan    jaxrose plan and jaxrose tune on ant-mlp: measured profile, timelines, tuned plan (~5 min)
#   suite   SPEC [SYSTEMS]: SPEC is PRESET:STEPS:SECONDS[:EVALS[:SYSTEMS]],... ; each preset with brax, sim,
#           sequential (or its own SYSTEMS, joined by +; default 3 evaluations), each bounded by its SECONDS;
#           suite.tar.gz rewritten after each preset
#   bgstage NAME STAGE [ARGS]: any stage detached in /tmp/bg/NAME, for more than one call: follow with `collect NAME`
#   notebooks [PRESET] [SEEDS]: the notebooks at FULL settings (needs .whl-nb carried; with bgstage: ~15-25 min)
#   gpu-tests [PYTEST ARGS]: the tests marked gpu (each MJX env's contract test) with JAX on the GPU, 8 pytest workers
#   arm     arm-push-mlp trained to its 20M budget: success rate per evaluation, learning curve (~3 min)
#   tuned   [PRESET] [STEPS] [PLAN]: brax, sim, sequential, overlapped and tuned (jaxrose tune's plan) in one run,
#           tuning time and trials included (ant-mlp 15M: ~9 min); with PLAN (a saved plan, e.g. the H200
#           ablation's docs/ablate/ant-mlp-h200-mps/tuned-plan.json, tuned with MPS) the tuned system trains with it, tuning nothing;
#           TUNED_SYSTEMS=brax,sequential,tuned drops the others. Tuning now also tries the evaluation in its own
#           process (3 short trainings), which takes it past one call's 600 s: run `tune` first, then this with PLAN
#   quota   ant-mlp 15M: overlapped with the evaluation process capped at 20% of the SMs
#   faults  [CASES] GPU-only faults (MPS daemon killed or missing, client killed mid-work): faults.json (~6-8 min)
#   bg      NAME ARGS...: starts `jaxrose ARGS...` detached (setsid) in /tmp/bg/NAME, for a run longer than one
#           call; it lives while the machine stays warm, so issue `collect` at once after each call returns
#   overlap [PRESET] [GROUPS] [QUOTAS]: how much of the async learner's work hides behind the actor's rollout of
#           GROUPS env groups (default 2) per learner SM quota (default "100,50,25"), V-trace learner
#           (scripts/gpu_overlap_probe.py; ~4 min; OVERLAP_ARGS adds train settings)
#   ceiling [PRESET] [ENVS] [SECONDS]: the simulation ceiling (sim system, 5 repeats) at each env count in ENVS
#           (default "8192 16384 32768"), each bounded by SECONDS (default 120); ceiling.tar.gz rewritten after each
#   collect NAME [SECONDS]: waits up to SECONDS (default 570) for that run, prints its [bench] lines and brings
#           back its folder as NAME.tar.gz (partial while it runs); exit 3 while it is still running, exit 4 at once
#           when the run is not on this machine (a fresh machine: the warm one went back between calls)
# Measured on the H200 (BENCHMARKS.md, 2026-12-02): each MJX system needs 100-150 s before its steady window
# (brax 204 s in all for arm-push-mlp at 20M), so brax + sim + sequential is 5-7 minutes per preset, and
# ant-mlp's asynchronous system 270-310 s at 10M steps: plan one or two presets per call, or use bg/collect.
set -u
. scripts/gpu_setup.sh || exit 1
out=${OUT:-/tmp/out}
detach() {  # NAME COMMAND...: COMMAND detached (setsid) with OUT=/tmp/bg/NAME/out, logging to /tmp/bg/NAME/log,
  # its exit status in /tmp/bg/NAME/exit (what `collect NAME` waits for)
  local name=$1; shift; rm -rf "/tmp/bg/$name"; mkdir -p "/tmp/bg/$name/out"
  OUT="/tmp/bg/$name/out" setsid nohup sh -c "$(printf "%q " "$@")> /tmp/bg/$name/log 2>&1; echo \$? > /tmp/bg/$name/exit" \
    > /dev/null 2>&1 < /dev/null &
  echo "started $name: $* (pid $!)"
}
start_bg() {  # NAME ARGS...: `jaxrose ARGS...` detached
  local name=$1; shift; detach "$name" python3 -m jaxrose.cli "$@"
}
case "${1:?stage}" in
  paths) timeout 400 python3 scripts/gpu_paths_check.py > "$out/paths.json" 2> "$out/paths.log"; echo "exit $?"
         cat "$out/paths.json"; grep -iv "warn" "$out/paths.log" | tail -5 ;;
  mps) timeout 200 python3 scripts/gpu_mps_check.py > "$out/mps.json" 2> "$out/mps.log"; cat "$out/mps.json" ;;
  ant) timeout 570 python3 -m jaxrose.cli bench --preset ant-mlp --systems brax,sim,sequential --repeats 5 \
         --out "$out/ant" --record "$out/BENCH_ant.md" > "$out/ant.log" 2>&1; grep "\[bench\]" "$out/ant.log" ;;
  ovl) timeout 400 python3 -m jaxrose.cli bench --preset ant-mlp --systems overlapped \
         --out "$out/ovl" --record "$out/BENCH_ovl.md" > "$out/ovl.log" 2>&1; grep "\[bench\]" "$out/ovl.log" ;;
  ovl-prio) # the overlapped system (evaluation in its own MPS process) with the evaluator at normal, then
         # below-normal MPS priority: does a yielding evaluator stop slowing the training beside it?
         for priority in normal below-normal; do
           timeout 260 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
             --systems overlapped --repeats 3 --out "$out/ovl_$priority" -- --run.compile-cache /tmp/bg/cc \
             --run.eval-priority "$priority" > "$out/ovl_$priority.log" 2>&1
           echo "$priority: $(grep "\[bench\].*steady" "$out/ovl_$priority.log")"
         done ;;
  unroll) # the sequential system with the rollout's per-step loop as a device loop, then unrolled
         for unrolled in no-unroll-rollout-steps unroll-rollout-steps; do
           timeout 280 python3 -m jaxrose.cli bench --preset "${2:-ant-mlp}" --total-env-steps 10000000 --num-evals 4 \
             --systems sequential --repeats 3 --out "$out/unroll_$unrolled" -- --run.compile-cache /tmp/bg/cc \
             "--run.$unrolled" > "$out/unroll_$unrolled.log" 2>&1
           echo "$unrolled: $(grep "\[bench\].*steady" "$out/unroll_$unrolled.log")"
         done ;;
  tfm) timeout 500 python3 -m jaxrose.cli bench --preset pusher-transformer --total-env-steps 10000000 --num-evals 5 \
         --systems sim,sequential,overlapped --repeats 5 --out "$out/tfm" --record "$out/BENCH_tfm.md" \
         > "$out/tfm.log" 2>&1; grep "\[bench\]" "$out/tfm.log" ;;
  spread) timeout 480 python3 -m jaxrose.cli bench --preset "${2:-pusher-transformer}" --total-env-steps "${3:-5000000}" \
         --num-evals 3 --systems sim,sequential,spread --repeats 5 --out "$out/spread" --record "$out/BENCH_spread.md" \
         > "$out/spread.log" 2>&1; grep "\[bench\]" "$out/spread.log" ;;
  async) start_bg async bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
         --systems async,brax,sequential,sim --repeats 3 --out /tmp/bg/async/results --record /tmp/bg/async/BENCH.md \
         -- --run.actors 1 --run.compile-cache /tmp/bg/cc ${2:+--run.learner-sm-percentage $2} ;;
  bf16) # [PRESET]: the inference-heavy preset with its networks computing in bfloat16 (network.compute_dtype): sequential
        # and async (session 22's settings) in one run, started detached (~7.5 min): follow with `collect bf16` in
        # the same call (`bf16; collect bf16 560`); then `fp32` in the next call for the float32 sequential run;
        # BF16_ARGS adds train settings (e.g. "--run.resources.start-groups 4")
        p=${2:-pusher-transformer}
        detach bf16 sh -c "python3 -m jaxrose.cli bench --preset $p --total-env-steps 3000000 --num-evals 3 \
          --systems sequential,async --repeats 3 --async-group-levels 1,2,4 --out /tmp/bg/bf16/out/bf16 \
          --record /tmp/bg/bf16/out/BENCH_bf16.md -- --network.compute-dtype bfloat16 --run.actors 1 \
          --run.compile-cache /tmp/bg/cc --run.max-policy-lag 7 --run.resources.interval 2 \
          --run.learner-priority below-normal --run.eval-priority below-normal ${BF16_ARGS:-}" ;;
  fp32) # [PRESET]: bf16's float32 sequential system alone (the learner's speed-up from bfloat16), ~4 min
        timeout 420 python3 -m jaxrose.cli bench --preset "${2:-pusher-transformer}" --total-env-steps 3000000 \
          --num-evals 3 --systems sequential --repeats 3 --out "$out/fp32" --record "$out/BENCH_fp32.md" \
          -- --run.compile-cache /tmp/bg/cc > "$out/fp32.log" 2>&1; grep "\[bench\]" "$out/fp32.log" ;;
  grow) start_bg grow bench --preset ant-mlp --total-env-steps "${2:-30000000}" --num-evals 6 --systems async,brax \
         --repeats 3 --async-group-levels "${3:-1,2,4}" --out /tmp/bg/grow/results --record /tmp/bg/grow/BENCH.md \
         ${GROW_BENCH_ARGS:-} -- --run.actors 1 --run.compile-cache /tmp/bg/cc ${GROW_ARGS:---run.max-policy-lag 7 --run.resources.interval 2} ;;
  growfix) # [STEPS] [SEED] [STARTS]: #8's time-to-threshold with V-trace targets, one detached chain on one machine (~4 min
        # per run at 50M: `growfix; collect growfix 560`, then `collect growfix`): the async system started at each of
        # STARTS env groups (default "1 2 4"), brax beside the first; CORRECTION (default vtrace) the off-policy
        # correction, GROWFIX_ARGS more train settings, GROWFIX_BENCH_ARGS more bench flags (e.g. "--budget-scales
        # async=1.6": the async system trains on past 50M steps, evaluating at brax's env steps)
        s=${2:-50000000}; c=${CORRECTION:-vtrace}; g="--run.actors 1 --run.compile-cache /tmp/bg/cc \
          --run.resources.grow-keeps update_size --run.max-policy-lag 7 --run.resources.interval 2 --run.seed ${3:-0} \
          --ppo.off-policy-correction $c ${GROWFIX_ARGS:-}"
        b="python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps $s --num-evals 6 --repeats 3 \
          --async-group-levels 1,2,4 --return-threshold ${GROW_THRESHOLD:-3000} ${GROWFIX_BENCH_ARGS:-}"
        chain=""; systems=async,brax
        for n in ${4:-1 2 4}; do  # a size named twice: its second run finds the first's compiles cached (-again)
          o=/tmp/bg/growfix/out/$c-start$n; case "$chain" in *"$o "*) o=$o-again ;; esac
          chain="$chain${chain:+; }$b --systems $systems --out $o -- $g --run.resources.start-groups $n"
          systems=async
        done
        detach growfix sh -c "$chain" ;;
  lagstudy) # [PRESET] [LAGS] [SEEDS]: PPO at fixed policy lags, per off-policy correction (jaxrose lag-study); ant-mlp's
        # 7 runs take longer than a call: `bgstage lagstudy lagstudy` and `collect lagstudy`. results.* after each run
        timeout "${LAG_SECONDS:-1500}" python3 -m jaxrose.cli lag-study --preset "${2:-ant-mlp}" --lags ${3:-0 4 8} \
          --seeds ${4:-1} --out "$out/lagstudy" ${LAG_ARGS:-} -- --run.compile-cache /tmp/bg/cc ${LAG_TRAIN_ARGS:-} 2>&1 \
          | tee "$out/lagstudy.log" | grep "^lag " ;;
  lagseeds) # [PRESET] [LAGS] [SEEDS]: `lagstudy` with each seed in its own detached process, sharing the GPU (the study
        # measures return per env step, not time; no process preallocates it); follow with `collect lag<SEED>` per seed
        for seed in ${4:-1 2}; do
          detach "lag$seed" env XLA_PYTHON_CLIENT_PREALLOCATE=false bash scripts/gpu_session.sh lagstudy "${2:-ant-mlp}" \
            "${3:-0 4 8}" "$seed"
        done ;;
  async-only) timeout 400 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
         --systems async,sim --repeats 3 ${3:+--eval-sm-percentage $3} --out "$out/async_only" \
         --record "$out/BENCH_async_only.md" -- --run.actors 1 --run.compile-cache /tmp/bg/cc \
         ${2:+--run.learner-sm-percentage $2} > "$out/async_only.log" 2>&1; grep "\[bench\]" "$out/async_only.log" ;;
  async-actors) timeout "${ASYNC_SECONDS:-400}" python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 \
         --num-evals 4 --systems "${SYSTEMS:-async}" --repeats 3 --out "$out/async_actors${2:-2}" \
         --record "$out/BENCH_async_actors${2:-2}.md" -- --run.actors "${2:-2}" --env.num-groups "${2:-2}" \
         --run.compile-cache /tmp/bg/cc > "$out/async_actors${2:-2}.log" 2>&1
       grep "\[bench\]" "$out/async_actors${2:-2}.log" ;;
  async-solo) timeout 400 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
         --systems async --repeats 3 --out "$out/async_solo" --record "$out/BENCH_async_solo.md" -- --run.actors 1 \
         --run.compile-cache /tmp/bg/cc --run.actor-run-ahead 0 --run.max-policy-lag 0 > "$out/async_solo.log" 2>&1
       grep "\[bench\]" "$out/async_solo.log" ;;
  priority) # the async system at each MPS priority setting (learner / evaluator), the baseline first and last
         run=0
         for setting in normal:normal below-normal:below-normal normal:below-normal normal:normal; do
           run=$((run + 1)); learner=${setting%%:*}; evaluator=${setting##*:}; tag="${run}_L${learner}_E${evaluator}"
           timeout 200 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
             --systems async --repeats 3 --out "$out/prio/$tag" -- --run.actors 1 --run.compile-cache /tmp/bg/cc \
             --run.learner-priority "$learner" --run.eval-priority "$evaluator" > "$out/prio_$tag.log" 2>&1
           echo "$tag: $(grep "\[bench\].*steady" "$out/prio_$tag.log")"
         done
         timeout 120 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 10000000 --num-evals 4 \
           --systems sim --repeats 5 --out "$out/prio/sim" > "$out/prio_sim.log" 2>&1; grep "\[bench\].*steady" "$out/prio_sim.log" ;;
  actor) JAX_COMPILATION_CACHE_DIR=/tmp/bg/cc timeout "${ACTOR_SECONDS:-420}" python3 scripts/gpu_actor_probe.py \
           "${2:-ant-mlp}" 9 ${3:+--alone-only} --out="$out/actor_probe.json" > "$out/actor_probe.log" 2>&1; grep -v "^{" "$out/actor_probe.log" | tail -12 ;;
  ablate) arms="${3:-sequential,all,no-overlap,no-groups,no-quotas}"
        timeout "${ABLATE_SECONDS:-560}" python3 -m jaxrose.cli ablate --presets "${2:-ant-mlp}" --arms ${arms//,/ } \
          --iterations 3 --max-candidates 2 --compile-cache /tmp/bg/cc --out "$out/ablate" > "$out/ablate.log" 2>&1
        echo "ablate exit $?"; grep -v "^\s*$" "$out/ablate.log" | grep -i "seed\|error\|Traceback" | tail -20 ;;
  probe) for flag in "" --no-mps; do
          mode=${flag:-"--mps"}; mode=${mode#--}
          timeout 280 python3 scripts/gpu_plan_probe.py "${2:-ant-mlp}" 7 $flag \
            --out="$out/probe_$mode.json" > "$out/probe_$mode.log" 2>&1; tail -n 1 "$out/probe_$mode.log"
        done ;;
  probe-companion) timeout 400 python3 scripts/gpu_plan_probe.py "${2:-ant-mlp}" 7 --no-mps --companion \
          --out="$out/probe_companion.json" > "$out/probe_companion.log" 2>&1; grep "^{" "$out/probe_companion.log" | tail -n 1 ;;
  scale) timeout 580 python3 scripts/gpu_scale_check.py "${2:-ant-mlp}" --gpus="${3:-2}" --steps="${4:-10000000}" \
          --out="$out/scale.json" > "$out/scale.log" 2>&1; grep "^{" "$out/scale.log" | tail -n 1 ;;
  suite) # SPEC: comma list of PRESET:STEPS:SECONDS[:EVALS[:SYSTEMS]]; each bench bounded, the bundle rewritten after each
        mkdir -p "$out/suite"; systems="${3:-brax,sim,sequential}"
        for entry in ${2//,/ }; do
          IFS=: read -r p steps limit evals entry_systems <<< "$entry"
          entry_systems=${entry_systems:-$systems}; entry_systems=${entry_systems//+/,}
          timeout "${limit:-150}" python3 -m jaxrose.cli bench --preset "$p" --total-env-steps "${steps:-5000000}" \
            --num-evals "${evals:-3}" --systems "$entry_systems" --repeats 3 --out "$out/suite/$p" --record "$out/suite/BENCH_$p.md" \
            > "$out/suite/$p.log" 2>&1 || echo "[bench] $p: exit $? (see suite/$p.log)"
          grep "\[bench\]" "$out/suite/$p.log"
          tar -czf "$out/suite.tar.gz" -C "$out" suite
        done; rm -rf "$out/suite" ;;
  gpu-tests) # [PYTEST ARGS]: the tests marked gpu (every registered MJX env's contract, tests/test_envs.py) on the GPU,
        # in GPU_TEST_WORKERS pytest-xdist processes (default 8; carry its wheels: offline-wheels.sh .whl
        # pytest-xdist==3.8.0 execnet==2.1.1), none preallocating GPU memory; junit XML and the log come back
        shift; XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_PLATFORMS=cuda timeout 560 python3 -m pytest -q -m gpu \
          -p no:cacheprovider -n "${GPU_TEST_WORKERS:-8}" --dist load --durations=0 \
          --junitxml="$out/gpu-tests.xml" "${@:-tests/test_envs.py}" > "$out/gpu-tests.log" 2>&1; echo "pytest exit $?"
        tail -5 "$out/gpu-tests.log" ;;
  arm) timeout 400 python3 -m jaxrose.cli train --preset arm-push-mlp --run.no-progress-bar --run.out-dir "$out/arm" \
         > "$out/arm.log" 2>&1; grep -i "eval\|error" "$out/arm.log" | tail -15;
       tar -czf "$out/arm.tar.gz" -C "$out" arm/metrics.jsonl arm/learning_curve.png && rm -rf "$out/arm" ;;
  tuned) timeout "${TUNED_SECONDS:-590}" python3 -m jaxrose.cli bench --preset "${2:-ant-mlp}" --total-env-steps "${3:-15000000}" \
         --num-evals 5 --systems "${TUNED_SYSTEMS:-brax,sim,sequential,overlapped,tuned}" --repeats 3 ${4:+--tuned-plan "$4"} --out "$out/tuned" \
         --record "$out/BENCH_tuned.md" -- --run.compile-cache /tmp/bg/cc > "$out/tuned.log" 2>&1; grep "\[bench\]" "$out/tuned.log" ;;
  quota) timeout 400 python3 -m jaxrose.cli bench --preset ant-mlp --total-env-steps 15000000 --num-evals 5 \
         --systems overlapped --eval-sm-percentage 20 --out "$out/quota" --record "$out/BENCH_quota.md" \
         > "$out/quota.log" 2>&1; grep "\[bench\]" "$out/quota.log" ;;
  faults) timeout 520 python3 scripts/gpu_faults.py ${2:+--cases "$2"} --out "$out/faults.json" > /dev/null 2> "$out/faults.log";
        python3 -c "import json,sys; print(json.dumps(json.load(open(sys.argv[1]))['verdicts'], indent=1))" "$out/faults.json" ;;
  bg) name=${2:?name}; shift 2; start_bg "$name" "$@" ;;
  bgstage) # NAME STAGE [ARGS...]: another stage detached in /tmp/bg/NAME (it outlives one call): follow with
        # `collect NAME`; its $OUT is /tmp/bg/NAME/out. E.g. bgstage suite suite SPEC; bgstage nb notebooks ant-mlp
        name=${2:?name}; shift 2
        case "${1:?stage}" in  # these detach themselves: wrapped, `collect` would see the wrapper's exit at once
          async|grow|bf16|bg|bgstage|collect)
            echo "bgstage: stage $1 already runs detached (or is not a stage to detach); run it as" \
                 "\`gpu_session.sh $1 ...\` and follow with \`collect ${1/bg*/NAME}\`" >&2; exit 2 ;;
        esac
        detach "$name" bash scripts/gpu_session.sh "$@" ;;
  notebooks) # [PRESET] [SEEDS]: the three notebooks at FULL settings (scripts/run_notebooks.py): quickstart trains
        # PRESET (default ant-mlp) to its budget, ablations runs every arm on PRESET for SEEDS (default [0]). The GPU
        # image has no Jupyter: carry .whl-nb/ too, made here (dependencies included) with
        #   python3 -m pip download --only-binary=:all: --python-version 3.12 --implementation cp \
        #     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        #     --platform manylinux1_x86_64 -d .whl-nb nbclient nbformat ipykernel
        if [ ! -f /tmp/site/.jaxrose-nb-wheels ]; then
          python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
            .whl-nb/*.whl && touch /tmp/site/.jaxrose-nb-wheels || exit 1
        fi
        timeout "${NOTEBOOK_SECONDS:-1500}" python3 scripts/run_notebooks.py --set FULL=True --set "PRESET=\"${2:-ant-mlp}\"" \
          --set "SEEDS=${3:-[0]}" --out "$out/notebooks" notebooks/quickstart.ipynb notebooks/custom_algorithm.ipynb \
          notebooks/ablations.ipynb 2>&1 | tee "$out/notebooks.log" | grep "^\[notebook\]"
        rm -rf "$out"/notebooks/*/runs/compile-cache; find "$out/notebooks" -type d -name checkpoints -prune -exec rm -rf {} + ;;
  overlap) JAX_COMPILATION_CACHE_DIR=/tmp/bg/cc timeout "${OVERLAP_SECONDS:-540}" python3 scripts/gpu_overlap_probe.py \
           "${2:-ant-mlp}" 9 --groups="${3:-2}" --quotas="${4:-100,50,25}" --out="$out/overlap_probe.json" -- \
           --ppo.off-policy-correction vtrace ${OVERLAP_ARGS:-} > "$out/overlap_probe.log" 2>&1
         echo "exit $?"; grep -v "^{\|warp\|warn" "$out/overlap_probe.log" | tail -12 ;;
  xlaflags) JAX_COMPILATION_CACHE_DIR=/tmp/bg/cc timeout "${XLAFLAGS_SECONDS:-540}" python3 scripts/gpu_xla_flags_probe.py \
           "${2:-ant-mlp}" 9 --groups="${3:-2}" ${4:+--variants=$4} ${5:+--programs=$5} --out="$out/xla_flags_probe.json" -- \
           --ppo.off-policy-correction vtrace ${XLAFLAGS_ARGS:-} > "$out/xla_flags_probe.log" 2>&1
         echo "exit $?"; grep -v "^{\|warp\|warn" "$out/xla_flags_probe.log" | tail -14; tail -1 "$out/xla_flags_probe.log" ;;
  ceiling) # [PRESET] [ENVS] [SECONDS]: one bench of the sim system per env count, the bundle rewritten after each
        mkdir -p /tmp/ceiling; for n in ${3:-8192 16384 32768}; do
          timeout "${4:-120}" python3 -m jaxrose.cli bench --preset "${2:-ant-mlp}" --systems sim --repeats 5 \
            --out "/tmp/ceiling/sim$n" -- --env.num-envs "$n" > "/tmp/ceiling/sim$n.log" 2>&1 \
            || echo "ceiling at $n envs: exit $? (124: past ${4:-120} s)"
          grep "\[bench\]" "/tmp/ceiling/sim$n.log"; tar -czf "$out/ceiling.tar.gz" -C /tmp ceiling
        done ;;
  collect) name=${2:?name}; deadline=$(( $(date +%s) + ${3:-570} ))
      # A machine given back between calls (30 s idle) comes back bare: fail at once rather than wait out the deadline
      if [ ! -d "/tmp/bg/$name" ]; then
        echo "collect: /tmp/bg/$name does not exist: this machine was started afresh (the one that ran it went back" \
             "after its idle time), so that run is lost; start it again and collect in the same call" >&2; exit 4
      fi
      while [ ! -f "/tmp/bg/$name/exit" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
      grep "\[bench\]\|\[notebook\]\|^lag " "/tmp/bg/$name/log"; tar -czf "$out/$name.tar.gz" -C /tmp/bg "$name"
      if [ -f "/tmp/bg/$name/exit" ]; then echo "exit $(cat /tmp/bg/$name/exit)"; else echo "still running"; exit 3; fi ;;
  tune) # [PRESET]: jaxrose tune alone, evaluation placement included; its plan.json and tune.json come back, to
        # commit and hand to `tuned PRESET STEPS PLAN` in the next call (each call fits the 600 s limit, so a machine
        # given back between the calls loses nothing)
        timeout 580 python3 -m jaxrose.cli tune --preset "${2:-ant-mlp}" --out "$out/tune" > "$out/tune.log" 2>&1
        echo "exit $?"; grep -v "warp\|warn" "$out/tune.log" | tail -n 12 ;;
  plan) timeout 250 python3 -m jaxrose.cli plan --preset "${2:-ant-mlp}" --out "$out/plan" > "$out/plan.log" 2>&1;
        timeout 300 python3 -m jaxrose.cli tune --preset "${2:-ant-mlp}" --iterations 5 --out "$out/tune" > "$out/tune.log" 2>&1;
        tail -n 5 "$out/plan.log" "$out/tune.log" ;;
esac
