#!/usr/bin/env bash
# The GPU check, at most 8 minutes on one H200: bf16 training steps of each method at the real
# Qwen3-0.6B and 1.7B widths (tokens/s, MFU, peak memory against the planner) and flex attention
# against dense 2L masks (loss, gradients, time, memory). Writes $OUT/gpu_check.log (or ./gpu_check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-.}/gpu_check.log"
python -m pip install -q torch==2.13.0 -e . 2>&1 | tail -2 || true
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$out"
timeout 420 python benchmarks/gpu_step.py --shapes 0.6b 1.7b --seq 2048 --rows 2 2>&1 | tee -a "$out"
