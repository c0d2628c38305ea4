#!/bin/bash
# Issue 30 on a machine with one NVIDIA GPU, in one command: run validation/gpu.yaml through the
# executor (nccl, world size 1; bench/gpu_validate.py run), then calibrate the GPU into a profile.
# Everything lands in $OUT (default bench/out/gpu); afterwards, anywhere:
# `python bench/gpu_validate.py table --json $OUT/gpu_validate.json --profile $OUT/profile.yaml`.
# Needs only the image's python3 with CUDA torch; simpy (and torchao, for the fp8 layouts) travel as
# wheels in .whl/ (the machine may have no package index): `pip download --no-deps --only-binary=:all:
# --python-version 3.12 --platform manylinux_2_28_x86_64 -d .whl simpy==4.1.1 torchao==0.17.0`.
# SERVING=1 (issue 53) then serves on the GPU too: the loop's CUDA tests, then bench/serving_local.py on
# plans/serving/small-gpu-localhost.yaml (bf16; SERVING_SEQS, default "2 8 32") and the tiny fp32 plan
# (SERVING_TINY_SEQS, default "2 8"), each calibrated there first (the H200's profile for the roofline
# terms): $OUT/serving_{small,tiny}.csv and the calibration $OUT/serving-calibration.yaml. SKIP_RUNS=1 leaves
# out the training matrix.
# Settings (environment): ONLY="layout ..." (these layouts of the matrix alone), STEPS and WARMUP
# (default 12 and 4), RUNS_LIMIT_S and CALIBRATE_LIMIT_S (the two parts' time limits), SKIP_CALIBRATE=1,
# PROFILE=1 (and PROFILE_LIMIT_S: one step per layout under torch.profiler, $OUT/profile_steps.txt).
# The twenty-fifth session's H200 calls, for instance: ONLY="bf16 bf16-act-offload-12 ..." STEPS=8 WARMUP=3.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-bench/out/gpu}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TRAINPLAN_PROFILE=$OUT/profile.yaml
{ nvidia-smi; python3 -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; } \
  > "$OUT/env.txt" 2>&1
if [ "${SERVING:-0}" = 1 ]; then   # the serving loop on the GPU (bench/serving_local.py), before the rest
  start=$SECONDS
  python3 -m pytest -p no:cacheprovider tests/serving/test_serving_cuda.py 2>&1 | tail -3
  export TRAINPLAN_SERVING_PROFILE=$OUT/serving-calibration.yaml
  serve_matrix() {   # name, plan, time limit (s), max_num_seqs rows
    TRAINPLAN_PROFILE=${SERVING_PROFILE:-topologies/catalog/profiles/h200-141gb.yaml} \
      timeout "$3" python3 bench/serving_local.py --plan "$2" --seqs $4 --csv "$OUT/serving_$1.csv" 2>&1 \
      | tee "$OUT/serving_$1.log"
  }
  serve_matrix small plans/serving/small-gpu-localhost.yaml "${SERVING_LIMIT_S:-240}" "${SERVING_SEQS:-2 8 32}"
  serve_matrix tiny plans/serving/tiny-localhost.yaml "${SERVING_TINY_LIMIT_S:-150}" "${SERVING_TINY_SEQS:-2 8}"
  echo "serving: $((SECONDS - start)) s"
fi
if [ "${SKIP_RUNS:-0}" != 1 ]; then   # the runs (they need no profile: the predictions are made afterwards)
  start=$SECONDS
  timeout "${RUNS_LIMIT_S:-290}" python3 bench/gpu_validate.py run --out "$OUT" ${ONLY:+--only $ONLY} \
    --steps "${STEPS:-12}" --warmup "${WARMUP:-4}" 2>&1 | tee "$OUT/validate.log"
  echo "runs: $((SECONDS - start)) s"
fi
if [ "${PROFILE:-0}" = 1 ]; then   # one profiled step per layout: bench/gpu_profile_steps.py
  start=$SECONDS
  timeout "${PROFILE_LIMIT_S:-150}" python3 bench/gpu_profile_steps.py --out "$OUT" ${ONLY:+--only $ONLY} 2>&1 | tail -8
  echo "profile: $((SECONDS - start)) s"
fi
if [ "${SKIP_CALIBRATE:-0}" != 1 ]; then
  start=$SECONDS
  timeout "${CALIBRATE_LIMIT_S:-300}" python3 -m trainplan.cli calibrate --out "$OUT/profile.yaml" > "$OUT/calibrate.log" 2>&1
  echo "calibrate: exit $? in $((SECONDS - start)) s"; grep "^calibrate: " "$OUT/calibrate.log"; tail -2 "$OUT/calibrate.log"
fi
