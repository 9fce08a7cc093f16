#!/usr/bin/env python3
"""Where a decode step's GPU time goes: the kernels of one step from an Nsight Compute run, each timed alone.

On the GPU machine (ncu is there; give it --clock-control none, and graphs off so that it sees each kernel):

    QINFER_CUDA_GRAPHS=0 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum --csv \\
        build-gpu/qinfer bench --model DIR --device cuda --batch 1 --prompt 16 --gen 3 --context 512 > times.csv
    tools/gpu_bench/kernel_times.py times.csv

A step is what runs after one greedy pick (argmax_merge_kernel, the step's last kernel) up to and including the
next: the table is the last complete step, its kernels grouped by name and grid, with how often each ran in the
step, its median time and its share. ncu serialises kernels, so the sum is the step's kernel time without the
overlap of programmatic dependent launch and without launch gaps: compare it with bench's ms/step.
(tools/gpu_bench/check.sh --kernel-times SHAPE does all of this.) With --longest, the step with the most kernel
time instead: run bench with one --prompt length and --gen 1 to see a prefill's kernels.
"""

import argparse
import csv
import io
import re
import statistics
import sys

STEP_END = "argmax_merge_kernel"


def read_launches(text):
    """(kernel name, grid, duration in µs) per launch, in launch order, from ncu --csv output."""
    lines = text.splitlines()
    header = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if header is None:
        raise ValueError("no ncu CSV header (a line starting with \"ID\") in the input")
    launches = []
    for row in csv.DictReader(io.StringIO("\n".join(lines[header:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        value = float(row["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit)
        if scale is None:
            raise ValueError(f"unknown duration unit {unit!r}")
        launches.append((short_name(row["Kernel Name"]), row["Grid Size"], value * scale))
    return launches


def short_name(name):
    """A kernel's name without namespaces, parameters and the void return type, template arguments kept."""
    # ncu writes anonymous namespaces as "(anonymous namespace)::", "<unnamed>::" or "unnamed>::".
    name = re.sub(r"^void |\(anonymous namespace\)::|<unnamed>::|unnamed>::", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the parameter list: the first '(' outside template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    return re.sub(r"\bqinfer::(cuda::)?", "", name[:cut])


def steps(launches):
    """The launches of each complete step (after one STEP_END up to and including the next)."""
    ends = [i for i, (name, _, _) in enumerate(launches) if name.startswith(STEP_END)]
    if len(ends) < 2:
        raise ValueError(f"fewer than two {STEP_END} launches: no complete greedy step in the input")
    return [launches[a + 1 : b + 1] for a, b in zip(ends, ends[1:])]


def longest(all_steps):
    """The step with the most kernel time: in a bench run of one prefill length, a timed prefill."""
    return max(all_steps, key=lambda step: sum(us for _, _, us in step))


def table(step):
    groups = {}
    for name, grid, us in step:
        groups.setdefault((name, grid), []).append(us)
    total = sum(us for _, _, us in step)
    rows = sorted(groups.items(), key=lambda kv: -sum(kv[1]))
    out = [f"{len(step)} kernels in the step, {total:.1f} µs timed alone (ncu)",
           f"{'kernel':<64} {'grid':<14} {'count':>5} {'median µs':>10} {'total µs':>9} {'share':>6}"]
    for (name, grid), times in rows:
        out.append(f"{name[:64]:<64} {grid:<14} {len(times):>5} {statistics.median(times):>10.2f} "
                   f"{sum(times):>9.1f} {100 * sum(times) / total:>5.1f}%")
    return "\n".join(out)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu --csv output with gpu__time_duration.sum ('-': standard input)")
    parser.add_argument("--longest", action="store_true",
                        help="the step with the most kernel time (a prefill) instead of the last one")
    args = parser.parse_args(argv)
    text = sys.stdin.read() if args.csv == "-" else open(args.csv, encoding="utf-8", errors="replace").read()
    try:
        all_steps = steps(read_launches(text))
        print(table(longest(all_steps) if args.longest else all_steps[-1]))
    except ValueError as e:
        print(f"kernel_times.py: {args.csv}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
