"""Matrix-multiply FLOP/s in float32 and bfloat16 on one backend.

    KERAS_BACKEND=torch python -m benchmarks.probe [--size 1024]
        [--threads N] [--output FILE.json]

Whether ``mixed_bfloat16`` can pay off on this machine: bfloat16 matrix
multiplies are only faster where the CPU has bfloat16 units (AVX512-BF16
or AMX-BF16, in `machine()["cpu_flags"]`); elsewhere they are emulated.
"""

import argparse
import os

from benchmarks import _common


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--output", default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    if args.smoke:
        args.size, args.repeats = 64, 1
    _common.pin_threads(args.threads)
    _common.pin_frameworks(args.threads)
    report = {
        "benchmark": "probe",
        "machine": _common.machine(),
        "threads": args.threads,
        "size": args.size,
    }
    for dtype in ("float32", "bfloat16"):
        flops = _common.matmul_probe(args.size, args.repeats, dtype)
        report[f"{dtype}_gflops"] = flops / 1e9
        print(f"{dtype:<9} {flops / 1e9:8.2f} GFLOP/s", flush=True)
    report["bfloat16_speedup"] = (
        report["bfloat16_gflops"] / report["float32_gflops"]
    )
    print(f"bfloat16 / float32: {report['bfloat16_speedup']:.3f}x")
    _common.write_json(args.output, report)
    return report


if __name__ == "__main__":
    main()
