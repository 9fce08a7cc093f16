#!/usr/bin/env python3
"""tools/gpu_bench/kernel_times.py on a made-up Nsight Compute CSV: the last complete greedy decode step is
found between argmax_merge_kernel launches, names lose namespaces and parameters, durations are grouped by
name and grid, and input without a complete step is an error naming the cause."""

import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "gpu_bench", "kernel_times.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import kernel_times  # noqa: E402

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def csv_text(launches, unit="ns"):
    rows = ["==PROF== Connected to process 1", "model ... (bench output)", HEADER]
    for i, (name, grid, value) in enumerate(launches):
        rows.append(f'"{i}","1","qinfer","host","{name}","1","13","(256, 1, 1)","{grid}","0","9.0",'
                    f'"Command line profiler metrics","gpu__time_duration.sum","{unit}","{value}"')
    return "\n".join(rows) + "\n"


GEMV = "void unnamed>::gemv_affine_kernel<4, unnamed>::ScaleBf16>(const float *, unnamed>::AffineBatch)"
NORM = "void qinfer::<unnamed>::norm_vec_kernel<3, 256, 4>(qinfer::<unnamed>::Rows)"
PARTS = "qinfer::(anonymous namespace)::argmax_parts_kernel(const float *, long, long, Best *)"
MERGE = "unnamed>::argmax_merge_kernel(const Best *, long, int, int *)"


class KernelTimes(unittest.TestCase):
    def test_names_lose_namespaces_and_parameters(self):
        self.assertEqual(kernel_times.short_name(GEMV), "gemv_affine_kernel<4, ScaleBf16>")
        self.assertEqual(kernel_times.short_name(NORM), "norm_vec_kernel<3, 256, 4>")
        self.assertEqual(kernel_times.short_name(PARTS), "argmax_parts_kernel")

    def test_the_last_complete_step_is_grouped(self):
        prefill = [(GEMV, "(264, 1, 1)", "999,000")]  # before the first pick: not a decode step
        step1 = [(GEMV, "(192, 1, 1)", "50,000"), (PARTS, "(19, 1, 1)", "4,000"), (MERGE, "(1, 1, 1)", "2,000")]
        step2 = [(GEMV, "(192, 1, 1)", "12,000"), (NORM, "(1, 1, 1)", "3,000"), (GEMV, "(192, 1, 1)", "14,000"),
                 (GEMV, "(128, 1, 1)", "9,000"), (PARTS, "(19, 1, 1)", "4,000"), (MERGE, "(1, 1, 1)", "2,000")]
        tail = [(GEMV, "(192, 1, 1)", "77,000")]  # a step cut short: left out
        launches = kernel_times.read_launches(csv_text(prefill + step1 + step2 + tail))
        all_steps = kernel_times.steps(launches)
        self.assertEqual(len(all_steps), 1)  # step1 has no STEP_END before it
        step = all_steps[-1]
        self.assertEqual(len(step), 6)
        self.assertAlmostEqual(sum(us for _, _, us in step), 44.0)
        out = kernel_times.table(step)
        self.assertIn("6 kernels in the step, 44.0 µs", out)
        lines = out.splitlines()
        first = lines[2].split()
        self.assertEqual(first[0], "gemv_affine_kernel<4,")  # the (192) pair: 26 µs, the largest share
        self.assertIn("(192, 1, 1)", lines[2])
        self.assertIn(" 2 ", lines[2])  # ran twice
        self.assertIn("13.00", lines[2])  # median of 12 and 14
        self.assertTrue(any("norm_vec_kernel<3, 256, 4>" in line for line in lines))

    def test_the_longest_step_is_the_one_with_the_most_kernel_time(self):
        short = [(GEMV, "(192, 1, 1)", "10,000"), (MERGE, "(1, 1, 1)", "2,000")]
        long = [(GEMV, "(512, 1, 1)", "90,000"), (NORM, "(64, 1, 1)", "5,000"), (MERGE, "(1, 1, 1)", "2,000")]
        launches = kernel_times.read_launches(csv_text(short + long + short + short))
        step = kernel_times.longest(kernel_times.steps(launches))
        self.assertEqual(len(step), 3)
        self.assertAlmostEqual(sum(us for _, _, us in step), 97.0)

    def test_microsecond_units_are_read(self):
        launches = kernel_times.read_launches(csv_text([(MERGE, "(1, 1, 1)", "1.5")], unit="us"))
        self.assertAlmostEqual(launches[0][2], 1.5)

    def test_input_without_a_step_is_an_error(self):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "times.csv")
            with open(path, "w") as f:
                f.write(csv_text([(GEMV, "(192, 1, 1)", "1")]))
            proc = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("no complete greedy step", proc.stderr)
            with open(path, "w") as f:
                f.write("not a csv\n")
            proc = subprocess.run([sys.executable, SCRIPT, path], capture_output=True, text=True, timeout=60)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("no ncu CSV header", proc.stderr)


if __name__ == "__main__":
    unittest.main()
