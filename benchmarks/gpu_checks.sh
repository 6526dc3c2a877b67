#!/usr/bin/env bash
# The CUDA checks, in order of value: the device probe, a real bert-large search (~8 min), the
# recommended config in a 200-step plain Trainer run, and the HF guide's eight configurations.
# Run from the repo root with autotune importable (installed, or PYTHONPATH=$PWD).
#
#     OUT=benchmarks/results/$(date +%F)-h100 bash benchmarks/gpu_checks.sh [N_TRIALS]
set -euo pipefail
OUT=${OUT:?set OUT to the folder for the results}
N_TRIALS=${1:-24}
mkdir -p "$OUT"
python3 -m autotune.hardware > "$OUT/probe.json"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/nvidia-smi.csv" || true
python3 -m autotune search model=bert-large-uncased seq_len=512 "n_trials=$N_TRIALS" timeout=7m \
  "out=$OUT/reports" study=bert-large-s512 2>&1 | tee "$OUT/search.txt"
cp "$OUT/reports/bert-large-s512/"{trials.csv,pareto.csv,recommended.json} "$OUT/"
python3 benchmarks/fidelity.py "$OUT/reports/bert-large-s512" --steps 200 --out "$OUT/fidelity.json"
python3 benchmarks/guide_table.py --out "$OUT/guide_table.md"
