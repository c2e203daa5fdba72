#!/usr/bin/env bash
# GPU check: the headline model on synthetic CIFAR-sized data for a fixed number of steps under
# ddp, fsdp and deepspeed, printing what really ran (from the MLflow tags), images/s and peak GPU
# memory for each. Run by hand on a machine with NVIDIA GPUs, from the repository root:
#     uv run bash benchmarks/gpu_check.sh     # all GPUs of this machine (inside the environment)
#     NPROC=1 uv run bash benchmarks/gpu_check.sh
# Needs the project installed (uv sync, or pip install -e '.[deepspeed]' for the deepspeed line).
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
echo "logs and runs in $OUT"
