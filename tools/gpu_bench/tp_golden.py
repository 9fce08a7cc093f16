#!/usr/bin/env python3
"""Tensor-parallel logits against single-device logits and transformers', per golden fixture.

For every fixture under tests/fixtures/golden and every prompt of its reference.json, runs
`qinfer eval --device DEVICE --logits` with --tensor-parallel 1 and with each N of --tp, and prints
the relative RMS of TP=N against TP=1 and of each against the fixture's transformers logits, plus
whether the argmax rows agree. Exits non-zero when a TP=N run is above --tolerance against TP=1.

  python3 tools/gpu_bench/tp_golden.py --qinfer build/qinfer --device cuda --tp 2 [--mode prefill]
"""
import argparse
import array
import json
import math
import os
import subprocess
import sys
import tempfile


def load(path, cols):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return [a[i:i + cols] for i in range(0, len(a), cols)]


def rel_rms(got, want):
    diff = sum((g - w) ** 2 for gr, wr in zip(got, want) for g, w in zip(gr, wr))
    norm = sum(w * w for wr in want for w in wr)
    return math.sqrt(diff / max(norm, 1e-30))


def argmax(rows):
    return [max(range(len(r)), key=r.__getitem__) for r in rows]


def run_eval(qinfer, model, ids, device, tp, mode, precision, path):
    cmd = [qinfer, "eval", "--model", model, "--ids", ",".join(map(str, ids)), "--device", device,
           "--mode", mode, "--logits", path, "--tensor-parallel", str(tp), "--precision", precision]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qinfer", required=True)
    ap.add_argument("--fixtures", default="tests/fixtures/golden")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tp", default="2", help="comma-separated N to compare with N = 1")
    ap.add_argument("--mode", default="prefill")
    ap.add_argument("--precision", default="exact", help="cuda prompt precision (exact: comparable to transformers)")
    ap.add_argument("--tolerance", type=float, default=2e-2)
    args = ap.parse_args()
    sizes = [int(n) for n in args.tp.split(",")]
    worst, failures, refused = 0.0, 0, 0
    print(f"| fixture | prompt | tokens | TP | rel RMS vs TP=1 | vs transformers (TP=1 / TP=N) | argmax rows equal |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(os.listdir(args.fixtures)):
            model = os.path.join(args.fixtures, name)
            ref_path = os.path.join(model, "reference.json")
            if not os.path.isfile(ref_path):
                continue
            ref = json.load(open(ref_path))
            for i, ids in enumerate(ref["prompts"]):
                cols = ref["shape"][i][1]
                want = load(os.path.join(model, ref["logits"][i]), cols)
                one = os.path.join(tmp, "tp1.bin")
                err = run_eval(args.qinfer, model, ids, args.device, 1, args.mode, args.precision, one)
                if err:
                    print(f"| {name} | {i} | {len(ids)} | 1 | error: {err} | | |")
                    failures += 1
                    continue
                base = load(one, cols)
                for n in sizes:
                    path = os.path.join(tmp, f"tp{n}.bin")
                    err = run_eval(args.qinfer, model, ids, args.device, n, args.mode, args.precision, path)
                    if err and f"tensor parallel {n}:" in err:
                        # The checkpoint's shapes do not split n ways: qinfer refuses it by name, as it must.
                        print(f"| {name} | {i} | {len(ids)} | {n} | not split: {err} | | |")
                        refused += 1
                        continue
                    if err:
                        print(f"| {name} | {i} | {len(ids)} | {n} | error: {err} | | |")
                        failures += 1
                        continue
                    got = load(path, cols)
                    e = rel_rms(got, base)
                    worst = max(worst, e)
                    failures += e > args.tolerance
                    same = sum(a == b for a, b in zip(argmax(got), argmax(base)))
                    print(f"| {name} | {i} | {len(ids)} | {n} | {e:.2e} | {rel_rms(base, want):.2e} / "
                          f"{rel_rms(got, want):.2e} | {same}/{len(ids)} |")
    print(f"\nworst TP=N vs TP=1: {worst:.2e} (tolerance {args.tolerance:.0e}); failures: {failures}; "
          f"runs refused because the shapes do not split: {refused}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
