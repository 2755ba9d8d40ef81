#!/usr/bin/env bash
# The GPU measurements, one call: `benchmarks.gpu` on JAX and torch, in
# bfloat16 at three batch sizes and in float32 at the paper's, each run in
# its own process and its own time limit, so one failure costs one row.
#
#     bash benchmarks/gpu_runs.sh OUTDIR [extra benchmarks.gpu arguments]
#
# Writes OUTDIR/gpu_<backend>_<dtype>_<batch>.json and prints a table.
# With `--smoke` among the extra arguments it runs on a CPU in seconds.
set -u
out=${1:?usage: gpu_runs.sh OUTDIR [benchmarks.gpu arguments]}
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}.
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
# Most important first: the paper's ~25k tokens per side (384 pairs of 64),
# bfloat16; then 4x that, where per-step overheads weigh less.
for run in jax:mixed_bfloat16:384 torch:mixed_bfloat16:384 \
    jax:mixed_bfloat16:1536 torch:mixed_bfloat16:1536 \
    jax:mixed_bfloat16:128 torch:mixed_bfloat16:128 \
    jax:float32:384 torch:float32:384; do
    IFS=: read -r backend dtype batch <<<"$run"
    name=gpu_${backend}_${dtype}_${batch}
    echo "=== $name"
    KERAS_BACKEND=$backend timeout "${GPU_RUN_TIMEOUT:-150}" \
        python3 -m benchmarks.gpu --dtype "$dtype" --batch-size "$batch" \
        --length 64 --steps 20 --max-seconds 30 \
        --output "$out/$name.json" "$@" \
        || echo "=== $name failed (exit $?)"
done
python3 - "$out" <<'EOF'
import glob, json, sys
rows = [json.load(open(p)) for p in sorted(glob.glob(f"{sys.argv[1]}/gpu_*.json"))]
print(f"{'backend':<8}{'dtype':<16}{'batch':>6}{'step ms':>9}{'tokens/s':>11}"
      f"{'TFLOP/s':>9}{'of peak':>9}{'of probe':>9}")
for r in rows:
    pf, rf = r["peak_fraction"], r["probe_fraction"]
    print(f"{r['machine']['backend']:<8}{r['dtype']:<16}{r['batch_size']:>6}"
          f"{r['step_s'] * 1e3:>9.1f}{r['tokens_per_s']:>11,.0f}"
          f"{r['achieved_tflops']:>9.1f}"
          f"{'-' if pf is None else f'{pf:.1%}':>9}"
          f"{'-' if rf is None else f'{rf:.1%}':>9}")
EOF
