#!/usr/bin/env bash
# The GPU measurements, one call: `benchmarks.gpu` on JAX and torch, in
# bfloat16 at three batch sizes and in float32 at the paper's, each run in
# its own process and its own time limit, so one failure costs one row.
#
#     bash benchmarks/gpu_runs.sh OUTDIR [extra benchmarks.gpu arguments]
#
# Writes OUTDIR/gpu_<backend>_<dtype>_<batch>.json and prints a table of
# the files this call wrote. With `--smoke` among the extra arguments it
# runs on a CPU in seconds (and every batch is the smoke test's).
set -u
out=${1:?usage: gpu_runs.sh OUTDIR [benchmarks.gpu arguments]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
# Most important first: 384 pairs of 64 positions (about 20k real tokens
# per side, near the paper's 25k), bfloat16; then 4x that, where per-step
# overheads weigh less.
written=()
for run in jax:mixed_bfloat16:384 torch:mixed_bfloat16:384 \
    jax:mixed_bfloat16:1536 torch:mixed_bfloat16:1536 \
    jax:mixed_bfloat16:128 torch:mixed_bfloat16:128 \
    jax:float32:384 torch:float32:384; do
    IFS=: read -r backend dtype batch <<<"$run"
    name=gpu_${backend}_${dtype}_${batch}
    rm -f "$out/$name.json"
    echo "=== $name"
    if KERAS_BACKEND=$backend timeout -k 10 "${GPU_RUN_TIMEOUT:-150}" \
        python3 -m benchmarks.gpu --dtype "$dtype" --batch-size "$batch" \
        --length 64 --steps 20 --max-seconds 30 \
        --output "$out/$name.json" "$@"; then
        written+=("$out/$name.json")
    else
        echo "=== $name failed (exit $?)"
    fi
done
python3 - "${written[@]}" <<'EOF'
import json, sys
rows = [json.load(open(path)) for path in sys.argv[1:]]
print(f"{'backend':<8}{'dtype':<16}{'batch':>6}{'step ms':>9}{'tokens/s':>11}"
      f"{'TFLOP/s':>9}{'of peak':>9}{'of probe':>9}")
for r in rows:
    peak, probe = r.get("peak_fraction"), r.get("probe_fraction")
    print(f"{r['machine']['backend']:<8}{r['dtype']:<16}{r['batch_size']:>6}"
          f"{r['step_s'] * 1e3:>9.1f}{r['tokens_per_s']:>11,.0f}"
          f"{r['achieved_tflops']:>9.1f}"
          f"{'-' if peak is None else f'{peak:.1%}':>9}"
          f"{'-' if probe is None else f'{probe:.1%}':>9}")
EOF
