#!/usr/bin/env bash
# GPU check: the headline model on synthetic CIFAR-sized data for a fixed number of steps under
# ddp, fsdp and deepspeed, printing what really ran (from the MLflow tags), images/s and peak GPU
# memory for each. Then a ~350M-parameter byte-level GPT (benchmarks/gpu_check_gpt.toml) under the
# same three strategies, with tokens/s, MFU and peak memory. Then a 2-worker sweep on two GPUs
# (SWEEP=0 leaves it out). Then, on one GPU,
# benchmarks/fastpath.py --part options: ResNet-18 with the CIFAR stem, batch 512, on CIFAR-format
# files the script writes, runjob's base job (fp32) against
# the same job with one option changed (channels_last, compile, foreach, fused, bf16,
# in_memory_off, cudnn_benchmark, all_on); it prints a line per run, the table (samples/s, ratio vs
# baseline, MFU, peak GiB, verdict) and the fastest variant against the goal of 60,000 images/s.
# Run by hand on a machine with NVIDIA GPUs, from the repository root:
#     uv run bash benchmarks/gpu_check.sh     # all GPUs of this machine (inside the environment)
#     NPROC=1 uv run bash benchmarks/gpu_check.sh
#     FASTPATH=0 uv run bash benchmarks/gpu_check.sh                       # the strategies only
#     GPT=0 uv run bash benchmarks/gpu_check.sh                            # without the ~350M GPT
#     FASTPATH_ARGS="--steps 200 --reps 3" uv run bash benchmarks/gpu_check.sh   # a longer fast-path run
# Needs the project installed (uv sync, or pip install -e '.[deepspeed]' for the deepspeed line).
# Expected to take well under 15 minutes on one H200: the strategies ~2, the GPT ~3 (not yet timed
# there: each run reads the stdlib, ~30 MB, and builds the model in every process), the fast path ~6-9
# (18 runs of 110 steps, most of it process start-up and compile's compiling; not yet timed there).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNJOB=${RUNJOB:-runjob}
PYTHON=${PYTHON:-python}
NPROC=${NPROC:-$(nvidia-smi --list-gpus 2>/dev/null | wc -l)}
STEPS=${STEPS:-60}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export MLFLOW_TRACKING_URI=${MLFLOW_TRACKING_URI:-sqlite:///$OUT/mlflow.db}
[ "$NPROC" -ge 1 ] || { echo "gpu_check: no GPU found (nvidia-smi)"; exit 1; }

printf '%-10s %-6s %-12s %-6s %-9s %-12s %-14s %s\n' strategy exit distributed world precision "images/s" "peak GiB/GPU" note
for strategy in ddp fsdp deepspeed; do
  dir="$OUT/$strategy"
  $RUNJOB benchmarks/gpu_check.toml --num-processes "$NPROC" --output-dir "$dir" \
    --set strategy.name="$strategy" --set train.max_steps="$STEPS" >"$OUT/$strategy.log" 2>&1
  code=$?
  "$PYTHON" - "$dir" "$code" "$strategy" "$OUT/$strategy.log" <<'PY'
import json, sys
from pathlib import Path
folder, code, strategy, log = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
tags, speed, peak, note = {}, "-", "-", ""
record = folder / "mlflow_run.json"
if record.exists():
    from mlflow import MlflowClient
    info = json.loads(record.read_text())
    run = MlflowClient(info["tracking_uri"]).get_run(info["run_id"])
    tags = run.data.tags
    note = tags.get("runjob.error", "")[:60]
metrics = folder / "metrics.jsonl"
if metrics.exists():
    points = [json.loads(line) for line in metrics.read_text().splitlines()]
    rates = [p["value"] for p in points if p["key"] == "train/samples_per_s"]
    rates = rates[1:] or rates  # skip the warm-up window when there are others
    peaks = [p["value"] for p in points if p["key"] == "train/peak_memory_gib"]
    speed = f"{sorted(rates)[len(rates) // 2]:.0f}" if rates else "-"
    peak = f"{max(peaks):.2f}" if peaks else "-"
if code != "0" and not note and log.exists():
    said = [line for line in log.read_text().splitlines() if line.startswith("runjob: ")]
    note = said[-1][8:90] if said else ""
print(f"{strategy:<10} {code:<6} {tags.get('runjob.distributed_type', '-'):<12} {tags.get('runjob.world_size', '-'):<6} "
      f"{tags.get('runjob.mixed_precision', '-'):<9} {speed:<12} {peak:<14} {note}")
PY
done

# A ~350M-parameter byte-level GPT (benchmarks/gpu_check_gpt.toml: 28 layers of width 1024, context
# 1024, bf16, batch 16 per GPU, on the stdlib's text) under the same three strategies: tokens/s, MFU
# and peak memory, each the median of the logged windows after the first. FSDP wraps each
# transformer block. GPT=0 skips it; GPT_STEPS sets its length.
if [ "${GPT:-1}" != 0 ]; then
  echo
  printf '%-10s %-6s %-12s %-6s %-9s %-12s %-7s %-14s %s\n' gpt exit distributed world precision "tokens/s" MFU "peak GiB/GPU" note
  for strategy in ddp fsdp deepspeed; do
    dir="$OUT/gpt-$strategy"
    extra=()
    [ "$strategy" = fsdp ] && extra=(--set strategy.auto_wrap_policy=transformer_based_wrap
                                     --set 'strategy.transformer_layer_cls_to_wrap=["Block"]')
    $RUNJOB benchmarks/gpu_check_gpt.toml --num-processes "$NPROC" --output-dir "$dir" \
      --set strategy.name="$strategy" --set train.max_steps="${GPT_STEPS:-60}" "${extra[@]}" >"$OUT/gpt-$strategy.log" 2>&1
    code=$?
    "$PYTHON" - "$dir" "$code" "$strategy" "$OUT/gpt-$strategy.log" <<'PY'
import json, sys
from pathlib import Path
folder, code, strategy, log = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
info = json.loads((folder / "mlflow_run.json").read_text()) if (folder / "mlflow_run.json").exists() else {}
tags = info.get("tags", {})
if info:
    from mlflow import MlflowClient
    tags = MlflowClient(info["tracking_uri"]).get_run(info["run_id"]).data.tags
points = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()] if (folder / "metrics.jsonl").exists() else []


def median(key, digits):
    values = [p["value"] for p in points if p["key"] == key]
    values = values[1:] or values  # skip the warm-up window when there are others
    return f"{sorted(values)[len(values) // 2]:.{digits}f}" if values else "-"


peaks = [p["value"] for p in points if p["key"] == "train/peak_memory_gib"]
note = tags.get("runjob.error", "")[:60]
if code != "0" and not note and log.exists():
    said = [line for line in log.read_text().splitlines() if line.startswith("runjob: ")]
    note = said[-1][8:90] if said else ""
print(f"{strategy:<10} {code:<6} {tags.get('runjob.distributed_type', '-'):<12} {tags.get('runjob.world_size', '-'):<6} "
      f"{tags.get('runjob.mixed_precision', '-'):<9} {median('train/tokens_per_s', 0):<12} {median('train/mfu', 3):<7} "
      f"{f'{max(peaks):.2f}' if peaks else '-':<14} {note}")
PY
  done
fi

# A sweep on two GPUs: jobs/digits_sweep.toml, 4 trials, --workers 2 with one GPU each. Prints each
# trial's GPUs (the runjob.sweep.devices tag), start and length, and how many ran at once (2 expected).
if [ "${SWEEP:-1}" != 0 ] && [ "$NPROC" -ge 2 ]; then
  echo
  echo "sweep: $RUNJOB sweep jobs/digits_sweep.toml --workers 2 --set sweep.trials=4 --set sweep.gpus_per_trial=1"
  $RUNJOB sweep jobs/digits_sweep.toml --workers 2 --output-dir "$OUT/sweep" --set sweep.trials=4 \
    --set sweep.gpus_per_trial=1 >"$OUT/sweep.log" 2>&1
  echo "sweep exit $?; its output in $OUT/sweep.log"
  "$PYTHON" - "$OUT/sweep" <<'PY'
import datetime, json, sys
from pathlib import Path
folder = Path(sys.argv[1])
trials = json.loads((folder / "trials.json").read_text()) if (folder / "trials.json").exists() else []
spans = []
for t in trials:
    tags = {}
    record = Path(t["output_dir"] or "") / "mlflow_run.json"
    if record.exists():
        tags = json.loads(record.read_text()).get("tags", {})
    print(f"trial {t['trial']}: {t['state']:<9} value {t['value']}  GPUs {tags.get('runjob.sweep.devices', '-')} "
          f"({tags.get('runjob.gpu', '-')})  started {t['started']}  {t['seconds']} s")
    if t["started"] and t["seconds"]:
        start = datetime.datetime.fromisoformat(t["started"]).timestamp()
        spans.append((start, start + t["seconds"]))
at_once = max((sum(s <= a < e for s, e in spans) for a, _ in spans), default=0)
print(f"sweep: {len(trials)} trial(s), at most {at_once} at once")
PY
fi

# The fast path on one GPU: each option against the base job (the default: 100 timed steps after 10
# warm-up, 2 interleaved repetitions; the in_memory_off variant with 8 DataLoader workers).
if [ "${FASTPATH:-1}" != 0 ]; then
  FASTPATH_ARGS=${FASTPATH_ARGS:---steps 100 --reps 2 --num-workers 8}
  echo
  echo "fast path: $PYTHON benchmarks/fastpath.py --part options --batch 512 --cifar-stem $FASTPATH_ARGS"
  # shellcheck disable=SC2086  # FASTPATH_ARGS is a list of flags
  "$PYTHON" benchmarks/fastpath.py --part options --batch 512 --cifar-stem $FASTPATH_ARGS \
    --json "$OUT/fastpath_options.json" 2>&1 | tee "$OUT/fastpath.log"
  echo "fast path exit ${PIPESTATUS[0]}; raw numbers in $OUT/fastpath_options.json"
fi
echo "logs and runs in $OUT"
