#!/usr/bin/env python3
"""tools/gpu_bench/bench_shapes.py without a GPU: how --gpus spreads the shapes, and that a --dry-run over two
GPUs and a --merge of separate calls each end with every shape/variant in one results file and one table."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "tools", "gpu_bench", "bench_shapes.py")
sys.path.insert(0, os.path.dirname(SCRIPT))
import bench_shapes  # noqa: E402


def run(*args):
    proc = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OUT=""))
    if proc.returncode != 0:
        raise AssertionError(f"bench_shapes.py {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return proc


class SpreadShapes(unittest.TestCase):
    def test_every_shape_runs_once_in_the_given_order(self):
        for gpus in (["0"], ["0", "1"], ["0", "1", "2", "3"], ["3", "5", "7"]):
            plan = bench_shapes.spread_shapes(bench_shapes.SHAPES, ["bf16", "4bit"], gpus)
            placed = [s for share in plan.values() for s in share]
            self.assertEqual(sorted(placed), sorted(bench_shapes.SHAPES), gpus)
            for share in plan.values():
                self.assertEqual(share, [s for s in bench_shapes.SHAPES if s in share])
            self.assertTrue(set(plan) <= set(gpus))

    def test_the_work_is_balanced(self):
        variants = ["bf16"]
        cost = lambda share: sum(bench_shapes.SHAPE_COST[s] for s in share)
        plan = bench_shapes.spread_shapes(bench_shapes.SHAPES, variants, ["0", "1"])
        loads = sorted(cost(share) for share in plan.values())
        # Largest-first greedy: the two GPUs differ by at most the largest single shape.
        self.assertLessEqual(loads[1] - loads[0], max(bench_shapes.SHAPE_COST.values()))
        self.assertEqual(len(plan), 2)

    def test_more_gpus_than_shapes_leaves_the_rest_idle(self):
        plan = bench_shapes.spread_shapes(["qwen3-8b"], ["bf16"], ["0", "1", "2"])
        self.assertEqual(plan, {"0": ["qwen3-8b"]})


class DryRuns(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.addCleanup(self.dir.cleanup)

    def entries(self, path):
        with open(path) as f:
            return json.load(f)["entries"]

    def test_two_gpus_merge_into_one_results_file(self):
        out = os.path.join(self.dir.name, "all.json")
        proc = run("--dry-run", "--gpus", "0,1", "--out", out, "--variants", "bf16,4bit")
        entries = self.entries(out)
        want = {f"{s}/{v}" for s in bench_shapes.SHAPES for v in ("bf16", "4bit")}
        self.assertEqual(set(entries), want)
        for key, entry in entries.items():
            self.assertIn("qinfer", entry, key)
            self.assertIn("baseline", entry, key)
        # Each child wrote its own file; the table printed last covers every shape.
        self.assertTrue(os.path.exists(out + ".gpu0") and os.path.exists(out + ".gpu1"))
        table = proc.stdout[proc.stdout.rindex("| shape |"):]
        for shape in bench_shapes.SHAPES:
            self.assertIn(f"| {shape} |", table)

    def test_separate_calls_merge(self):
        a, b = os.path.join(self.dir.name, "a.json"), os.path.join(self.dir.name, "b.json")
        run("--dry-run", "--shapes", "qwen3-8b", "--variants", "bf16", "--out", a)
        run("--dry-run", "--shapes", "qwen3_5-9b", "--variants", "4bit", "--out", b)
        merged = os.path.join(self.dir.name, "merged.json")
        proc = run("--out", merged, "--merge", a, b)
        self.assertEqual(set(self.entries(merged)), {"qwen3-8b/bf16", "qwen3_5-9b/4bit"})
        self.assertIn("| qwen3-8b |", proc.stdout)
        self.assertIn("| qwen3_5-9b |", proc.stdout)

    def test_a_stale_child_file_is_not_merged_again(self):
        out = os.path.join(self.dir.name, "all.json")
        with open(out + ".gpu1", "w") as f:
            json.dump({"entries": {"stale/bf16": {"shape": "stale", "variant": "bf16", "qinfer": {}}}}, f)
        run("--dry-run", "--gpus", "0,1", "--shapes", "qwen3-8b", "--variants", "bf16", "--out", out)
        self.assertEqual(set(self.entries(out)), {"qwen3-8b/bf16"})


if __name__ == "__main__":
    unittest.main()
