#!/usr/bin/env bash
# The CUDA checks, in order of value: the device probe, a real bert-large search, the
# recommended config in a 200-step plain Trainer run, and the HF guide's eight configurations.
#
# They are split into stages so that each one ends inside ten minutes and can run as one job on
# an offline GPU machine; each GPU stage writes at most eight files, flat, into $OUT.
#
#   bash benchmarks/gpu_checks.sh wheels
#       (where pip can download) fetch into ./.whl the wheels listed in gpu_wheels.txt: what the
#       GPU machine's image lacks of autotune's dependencies (~60 MB).
#   OUT=DIR bash benchmarks/gpu_checks.sh search [STUDY_TGZ]
#       (GPU, <= 9 min) probe.json, env.txt, search.txt, trials.csv, recommended.json,
#       report.html and study.tgz (the study folder without its inductor cache and report).
#       Given the study.tgz of an earlier search stage, the search resumes that study.
#   OUT=DIR bash benchmarks/gpu_checks.sh follow-up STUDY_TGZ
#       (GPU, ~6 min) fork_cuda.json, fidelity.json, overhead.txt, guide_table.md,
#       guide_table.json and follow_up.txt.
#   OUT=DIR bash benchmarks/gpu_checks.sh offload
#       (GPU, ~4 min) offload.json and offload.txt: FSDP2's offload and ZeRO-2/3 Offload on
#       one GPU train a model that does not fit the memory budget without
#       (benchmarks/offload.py).
#   OUT=DIR bash benchmarks/gpu_checks.sh knobs
#       (GPU, ~7 min) knobs.txt, knobs_trials.csv, knobs_recommended.json: a search of today's
#       GPU knobs (benchmarks/gpu_knobs.yaml) on Qwen2.5-0.5B, its notes saying which left
#       and why, and its pick verified over 100 steps (autotune verify).
#   OUT=DIR DEVICES=N bash benchmarks/gpu_checks.sh ranks
#       (N GPUs, ~5 min; in lease on a machine of 2 GPUs or more, 2 minutes on 2 of them)
#       ranks_gpu.json and ranks_gpu.txt: each strategy (DDP, DataParallel, FSDP, ZeRO, and
#       tensor parallelism on a 2-block Llama) trains a trial on N GPUs, checked as applied
#       (benchmarks/ranks_gpu.py).
#   OUT=DIR bash benchmarks/gpu_checks.sh landscape
#       (GPU, ~5 min) landscape.json and landscape.txt: settings of bert-large measured in one
#       process (benchmarks/landscapes/record_inprocess.py), for the GPU twin's calibration;
#       in lease, the twin re-fitted on them (twin/: points.json, constants.json and
#       twin-calibration.md, to commit: benchmarks/twin_calibration.py --add ... --fit).
#   OUT=DIR bash benchmarks/gpu_checks.sh lease
#       (GPU, <= 9 min) all of it, smaller, for a lease of 15 minutes, each stage bounded and
#       reporting whatever another did: the search's plan against the device's facts (plan.txt,
#       in a second), the headline search with its defaults for 2 minutes of trials, fidelity
#       over 60 steps, a trial's cost in parts (trial_overhead.py), the guide's table,
#       offload, 50 s of landscape, and on 2 GPUs or more the strategies on 2 of them;
#       plan.txt, probe.json, search.txt, trials.csv, study.tgz, fidelity.json, overhead.txt,
#       guide_table.md, offload.json, landscape.json, ranks_gpu.json (each as its stage ends)
#       and rest.tgz (the others). LEASE_STAGES picks stages (plan search follow-up offload landscape ranks).
#       A dry run on a CPU with the H100's facts, as CI runs it (exit 2 on a refusal):
#         PROBE=tests/fixtures/probe-h100-2026-11-26.json LEASE_STAGES=plan OUT=/tmp/lease \
#           bash benchmarks/gpu_checks.sh lease
#
# GPU stages install ./.whl (if present) into /tmp/site first. MODEL and SEQ_LEN pick another
# model; SEARCH_ARGS (key=value ...) replaces the bounded search settings below. A dry run of
# the mechanics on CPU: MODEL=google/bert_uncased_L-2_H-128_A-2 SEQ_LEN=64 SEARCH_ARGS=n_trials=4
set -euo pipefail
cd "$(dirname "$0")/.."
stage=${1:?usage: gpu_checks.sh wheels | search [STUDY_TGZ] | follow-up STUDY_TGZ | offload | knobs | landscape | ranks | lease}
work=/tmp/gpu-checks
study=gpu-check
model=${MODEL:-bert-large-uncased}
seq_len=${SEQ_LEN:-512}
# Bounded so the search stage ends inside ten minutes: trials start for 5 minutes and each may
# run 150 s (+100 s to compile); at 8 minutes the search is interrupted as Ctrl-C would do it
# (outputs written, the running trial retried on resume). A fixed effective batch keeps a trial
# to 13 steps of 128 samples (fp32 bert-large: about a minute) and reaches the memory edge
# (fp32 at micro batch 64, 16-bit at 128).
search_args=${SEARCH_ARGS:-effective_batch_size=128 n_trials=60 timeout=5m trial_timeout=150s \
compile_timeout=100s}
search_wall_s=${SEARCH_WALL_S:-480}

if [ "$stage" != wheels ]; then
  # Once for all the stages of a lease (each runs this script again).
  [ "$stage" != lease ] || rm -f /tmp/site/.installed
  if compgen -G ".whl/*.whl" >/dev/null && [ ! -e /tmp/site/.installed ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl && touch /tmp/site/.installed
  fi
  export PYTHONPATH=$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  export PYTHONUNBUFFERED=1
fi

if [ "$stage" = lease ]; then
  OUT=${OUT:?set OUT to the folder for the results}
  rest=$work/lease
  rm -rf "$rest" && mkdir -p "$OUT" "$rest/search" "$rest/follow-up" "$rest/offload" "$rest/landscape"
  stages=" ${LEASE_STAGES:-plan search follow-up offload landscape ranks} "
  # Each stage's files reach $OUT as it ends: a lease cut short keeps what it measured (the
  # H200's of 2026-12-04 was killed in its last stage, before a move at the end).
  collect() {
    for name in plan.txt search/probe.json search/search.txt search/trials.csv \
      follow-up/fidelity.json follow-up/overhead.txt follow-up/guide_table.md \
      offload/offload.json landscape/landscape.json ranks/ranks_gpu.json; do
      mv "$rest/$name" "$OUT/" 2>/dev/null || true  # a stage may have written none
    done
  }
  # The headline search as users start it (`autotune search model=bert-large-uncased
  # seq_len=512`: its default space, batch rule and sampler), bounded to 2 minutes of trials
  # and without the confirmation's rounds: its trials, the time to 90% of its best, best /
  # baseline.
  lease_args=${SEARCH_ARGS:-timeout=120s confirm_rounds=0 trial_timeout=60s compile_timeout=60s}
  # Each stage is bounded and reports on its own, whatever another did; about 8.5 minutes in all.
  if [[ $stages == *" plan "* ]]; then
    # The search's plan against this device's facts, in a second, before anything trains (the
    # first H100 lease was refused at its first command). PROBE: another device's probe file,
    # for a dry run on a CPU (tests/fixtures/probe-h100-2026-11-26.json).
    probe=${PROBE:-$rest/probe.json}
    [ -n "${PROBE:-}" ] || python3 -m autotune.child.probe > "$probe" || true
    # shellcheck disable=SC2086  # a list of key=value words
    python3 benchmarks/lease_plan.py "$probe" "model=$model" "seq_len=$seq_len" $lease_args \
      2>&1 | tee "$rest/plan.txt" || { echo "plan refused"; plan_refused=2; }
    collect
  fi
  if [[ $stages == *" search "* ]]; then
    OUT=$rest/search SEARCH_WALL_S=${SEARCH_WALL_S:-170} SEARCH_ARGS=$lease_args \
      bash "$0" search || echo "search stage exited with $?"
    cp "$rest/search/study.tgz" "$OUT/" 2>/dev/null || true
    collect
  fi
  if [[ $stages == *" follow-up "* ]]; then
    # Bounded so that the lease ends inside its 10 minutes: on the H200 (2026-12-04) 60
    # steps of a batch-240 pick, 50 s and the guide's 80 s were too few, 50 s of overhead
    # too many for its place.
    OUT=$rest/follow-up FIDELITY_STEPS=30 FIDELITY_WALL_S=60 OVERHEAD_WALL_S=40 GUIDE_WALL_S=60 \
      bash "$0" follow-up "$rest/search/study.tgz" || echo "follow-up stage exited with $?"
    collect
  fi
  if [[ $stages == *" offload "* ]]; then
    OUT=$rest/offload OFFLOAD_WALL_S=80 bash "$0" offload || echo "offload stage exited with $?"
    collect
  fi
  if [[ $stages == *" landscape "* ]]; then
    OUT=$rest/landscape LANDSCAPE_WALL_S=${LANDSCAPE_WALL_S:-50} bash "$0" landscape \
      || echo "landscape stage exited with $?"
    # The GPU twin re-fitted with the new points (pure Python, seconds): commit twin/*.
    if [ -s "$rest/landscape/landscape.json" ]; then
      mkdir -p "$OUT/twin"
      python3 benchmarks/twin_calibration.py --add "$rest/landscape/landscape.json" --fit \
        --out "$OUT/twin/twin-calibration.md" > "$rest/landscape/twin.txt" 2>&1 \
        && cp benchmarks/twin/points.json autotune/twin/constants.json "$OUT/twin/" \
        || echo "twin re-fit exited with $?"
    fi
    collect
  fi
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
  if [[ $stages == *" ranks "* ]] && [ "${gpus:-0}" -ge 2 ]; then
    # DDP against DataParallel (and tensor parallelism) on this machine's link.
    mkdir -p "$rest/ranks"
    OUT=$rest/ranks DEVICES=2 RANKS_WALL_S=${RANKS_WALL_S:-120} bash "$0" ranks \
      || echo "ranks stage exited with $?"
    collect
  fi
  tar -czf "$OUT/rest.tgz" -C "$rest" .
  exit "${plan_refused:-0}"
fi

if [ "$stage" = wheels ]; then
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl -r <(grep -v '^#' benchmarks/gpu_wheels.txt)
  # DeepSpeed publishes no wheel: build its pure-Python one from the source release.
  python3 -m pip wheel -q --no-deps -w .whl "$(grep -o 'deepspeed==[0-9.]*' \
    benchmarks/gpu_wheels.txt | head -1 || echo deepspeed)"
  du -sh .whl
  exit 0
fi

OUT=${OUT:?set OUT to the folder for the results}
mkdir -p "$OUT" "$work/reports"
if [ -n "${2:-}" ]; then
  tar -xzf "$2" -C "$work/reports"
fi

case "$stage" in
search)
  python3 -m autotune.child.probe > "$OUT/probe.json"
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true
    python3 -c "import sys, torch, transformers, optuna, bitsandbytes; \
print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); \
print('transformers', transformers.__version__); print('optuna', optuna.__version__); \
print('bitsandbytes', bitsandbytes.__version__)"
  } > "$OUT/env.txt" 2>&1
  # shellcheck disable=SC2086  # search_args is a list of key=value words
  timeout -s INT "$search_wall_s" python3 -m autotune search "model=$model" "seq_len=$seq_len" \
    $search_args "out=$work/reports" "study=$study" 2>&1 | tee "$OUT/search.txt" \
    || echo "search exited with ${PIPESTATUS[0]}" | tee -a "$OUT/search.txt"
  tar -czf "$OUT/study.tgz" -C "$work/reports" --exclude=inductor-cache --exclude=report.html \
    "$study"
  for name in trials.csv recommended.json report.html; do
    cp "$work/reports/$study/$name" "$OUT/" || true  # none without an ok trial
  done
  ;;
follow-up)
  [ -n "${2:-}" ] || { echo "follow-up needs the search stage's study.tgz" >&2; exit 2; }
  # A trial forked from the fork server must still reach the GPU (fork_cuda.py says why).
  # Each step is bounded so that the next one runs; an interrupted step writes no file.
  {
    python3 benchmarks/fork_cuda.py --out "$OUT/fork_cuda.json" || true
    timeout -s INT "${FIDELITY_WALL_S:-240}" python3 benchmarks/fidelity.py \
      "$work/reports/$study" --steps "${FIDELITY_STEPS:-200}" --out "$OUT/fidelity.json" || true
    timeout -s INT "${OVERHEAD_WALL_S:-120}" python3 benchmarks/trial_overhead.py \
      --model "$model" --seq-len "$seq_len" --batch-size 8 | tee "$OUT/overhead.txt" || true
    timeout -s INT "${GUIDE_WALL_S:-300}" python3 benchmarks/guide_table.py --model "$model" \
      --seq-len "$seq_len" --out "$OUT/guide_table.md" || true
  } 2>&1 | tee "$OUT/follow_up.txt"
  ;;
offload)
  timeout -s INT "${OFFLOAD_WALL_S:-300}" python3 benchmarks/offload.py \
    --out "$OUT/offload.json" 2>&1 | tee "$OUT/offload.txt" || true
  ;;
knobs)
  # Today's GPU knobs (FlashAttention, Liger, fp8, torchao's 8-bit AdamW, activation offload,
  # partial checkpointing, regional compile) on a small causal LM, then its pick verified.
  timeout -s INT "${KNOBS_WALL_S:-420}" python3 -m autotune search model=Qwen/Qwen2.5-0.5B \
    seq_len=512 space=benchmarks/gpu_knobs.yaml n_trials=16 timeout=4m trial_timeout=90s \
    compile_timeout=60s confirm_rounds=0 "out=$work/reports" study=knobs 2>&1 \
    | tee "$OUT/knobs.txt" || true
  cp "$work/reports/knobs/trials.csv" "$OUT/knobs_trials.csv" || true
  timeout -s INT 150 python3 -m autotune verify "$work/reports/knobs" steps=100 2>&1 \
    | tee -a "$OUT/knobs.txt" || true
  cp "$work/reports/knobs/recommended.json" "$OUT/knobs_recommended.json" || true
  ;;
landscape)
  # Many settings of bert-large measured in this one process, a shuffled share each lease
  # (record_inprocess.py): calibration points for the GPU model, without a process each.
  timeout -s INT "${LANDSCAPE_WALL_S:-300}" python3 benchmarks/landscapes/record_inprocess.py \
    "gpu-$model-s$seq_len" --model "$model" --seq-len "$seq_len" \
    --space "${LANDSCAPE_SPACE:-benchmarks/landscapes/gpu-bert-large.yaml}" \
    --budget-s "$(( ${LANDSCAPE_WALL_S:-300} - 30 ))" --out "$OUT/landscape.json" \
    > "$OUT/landscape.txt" 2>&1 || true
  tail -n 3 "$OUT/landscape.txt"
  ;;
ranks)
  timeout -s INT "${RANKS_WALL_S:-420}" python3 benchmarks/ranks_gpu.py \
    --devices "${DEVICES:-2}" --out "$OUT/ranks_gpu.json" 2>&1 | tee "$OUT/ranks_gpu.txt" || true
  ;;
*)
  echo "unknown stage $stage: wheels | search | follow-up | offload | knobs | landscape | ranks | lease" >&2
  exit 2
  ;;
esac
