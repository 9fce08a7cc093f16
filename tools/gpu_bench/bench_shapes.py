#!/usr/bin/env python3
"""qinfer vs a PyTorch (HF transformers) baseline on released Qwen shapes with random weights.

For each shape and variant: `qinfer bench --json` (decode tok/s and GB/s at batch 1/8/32, prefill at 512 and
8192 tokens), then, for bf16, the same shape built by transformers on the GPU (random bf16 weights, sdpa) timed
for prefill and greedy decode. Results merge into one JSON file keyed shape/variant, written after every part,
so a call cut short keeps what it finished and several calls build one table. See tools/gpu_bench/README.md.

    python3 tools/gpu_bench/bench_shapes.py --shapes qwen3-8b --variants bf16,4bit [--qinfer build-gpu/qinfer]
    python3 tools/gpu_bench/bench_shapes.py --gpus 0,1 --torch-batch 1      # the shapes spread over two GPUs
    python3 tools/gpu_bench/bench_shapes.py --out all.json --merge run1.json run2.json   # here: merge + table
"""

import argparse
import collections
import copy
import datetime
import gc
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SHAPES = ["qwen3-8b", "qwen3-30b-a3b", "qwen3_5-9b", "qwen3_5-27b", "qwen3_5-35b-a3b"]
VARIANT_ARGS = {"bf16": [], "4bit": ["--bits", "4"]}
QINFER_BATCHES, QINFER_PROMPTS, QINFER_GEN = "1,8,32", "512,8192", 128
PREFILL_TOKENS = (512, 8192)
DECODE_PROMPT = 512   # PyTorch decodes after a prompt as long as qinfer's first prefill length
QINFER_TIMEOUT_S = 540  # a device call has ~9 minutes; a hung qinfer should still leave a record
# Text-only causal LM per text model_type; anything else goes through AutoModelForCausalLM.
HF_CAUSAL_LM = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                "qwen3_next": "Qwen3NextForCausalLM", "qwen3_5_text": "Qwen3_5ForCausalLM",
                "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM"}


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def tail(text, n=2000):
    return text if len(text) <= n else "..." + text[-n:]

# ---------------------------------------------------------------------------------------------------
# Results file: {"entries": {"shape/variant": {"shape", "variant", "qinfer": part, "baseline": part}}}.
# A part is {"result": dict | None, "error" or "reason": str, "at": time}; merging replaces whole parts,
# so a --skip-torch run keeps the baseline an earlier call measured.


# Rough relative cost of a shape's run (qinfer bench, the baseline's build and compile): how --gpus
# balances the shapes over the GPUs.
SHAPE_COST = {"qwen3-8b": 1.0, "qwen3_5-9b": 1.0, "qwen3-30b-a3b": 1.2, "qwen3_5-27b": 1.6, "qwen3_5-35b-a3b": 1.4}
VARIANT_COST = {"bf16": 1.0, "4bit": 0.6}  # no baseline, but the weights are quantized on the host first


def spread_shapes(shapes, variants, gpus):
    """The shapes per GPU: largest first, each to the GPU with the least work so far."""
    load = {g: 0.0 for g in gpus}
    plan = {g: [] for g in gpus}
    cost = lambda s: SHAPE_COST.get(s, 1.0) * sum(VARIANT_COST[v] for v in variants)
    for shape in sorted(shapes, key=cost, reverse=True):
        g = min(gpus, key=lambda k: (load[k], gpus.index(k)))
        plan[g].append(shape)
        load[g] += cost(shape)
    return {g: [s for s in shapes if s in plan[g]] for g in gpus if plan[g]}  # the given order within a GPU


def run_on_gpus(args, argv, shapes, variants):
    """One child run per GPU (CUDA_VISIBLE_DEVICES) over its share of the shapes, each with its own results
    file; then all of them merged into --out."""
    gpus = [g for g in args.gpus.split(",") if g]
    plan = spread_shapes(shapes, variants, gpus)
    # The child keeps every flag but --gpus, --shapes and --out.
    keep, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
        elif a in ("--gpus", "--shapes", "--out"):
            skip = 1
        elif not a.startswith(("--gpus=", "--shapes=", "--out=")):
            keep.append(a)
    children = []
    for g, share in plan.items():
        out = f"{args.out}.gpu{g}"
        if os.path.exists(out):
            os.remove(out)  # a stale file from an earlier run would be merged again
        cmd = [sys.executable, os.path.abspath(__file__), *keep, "--shapes", ",".join(share), "--out", out]
        log(f"GPU {g}: {' '.join(share)}")
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=g)
        children.append((g, out, subprocess.Popen(cmd, env=env)))
    failed = []
    for g, out, proc in children:
        if proc.wait() != 0:
            failed.append(f"GPU {g} exited {proc.returncode}")
    doc = load_results(args.out)
    for g, out, _ in children:
        for entry in load_results(out)["entries"].values():
            for part in ("qinfer", "baseline"):
                if part in entry:
                    merge_part(doc, entry["shape"], entry["variant"], part, entry[part])
    save_results(args.out, doc)
    print(render_table(doc))
    log(f"results in {args.out}" + (f"; {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def load_results(path):
    if not os.path.exists(path):
        return {"entries": {}}
    with open(path) as f:
        doc = json.load(f)
    doc.setdefault("entries", {})
    return doc


def merge_part(doc, shape, variant, part, value):
    entry = doc["entries"].setdefault(f"{shape}/{variant}", {"shape": shape, "variant": variant})
    entry[part] = value


def save_results(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # a kill mid-write must not lose the earlier calls' results

# ---------------------------------------------------------------------------------------------------
# qinfer


def run_qinfer(qinfer, shape, variant):
    cmd = [qinfer, "bench", "--shape", shape, *VARIANT_ARGS[variant], "--device", "cuda", "--batch", QINFER_BATCHES,
           "--prompt", QINFER_PROMPTS, "--gen", str(QINFER_GEN), "--context", str(DECODE_PROMPT), "--json"]
    part = {"result": None, "command": " ".join(cmd), "at": now()}
    log(f"qinfer: {part['command']}")
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                                start_new_session=True)  # its own process group, so a timeout kills it all
    except OSError as e:
        part["error"] = f"cannot start {qinfer}: {e}"
        return part
    err_tail = collections.deque(maxlen=40)

    def echo_stderr():  # progress stays visible in the device log; the tail goes into the record
        for line in proc.stderr:
            sys.stderr.write(line)
            err_tail.append(line)

    reader = threading.Thread(target=echo_stderr, daemon=True)
    reader.start()
    killer = threading.Timer(QINFER_TIMEOUT_S, lambda: os.killpg(proc.pid, signal.SIGKILL))
    killer.start()
    out = proc.stdout.read()
    rc = proc.wait()
    killer.cancel()
    reader.join(timeout=5)
    part["wall_s"] = round(time.perf_counter() - start, 1)
    if rc != 0:
        why = f"killed after {QINFER_TIMEOUT_S} s" if rc == -9 else f"exit status {rc}"
        part["error"] = f"{why}: {tail(''.join(err_tail))}"
        return part
    try:  # exactly one JSON object is promised; tolerate stray text around it
        part["result"] = json.loads(out[out.index("{"):out.rindex("}") + 1])
    except ValueError as e:
        part["error"] = f"stdout is not a JSON object ({e}): {tail(out, 500)!r}"
    return part


def qinfer_config(qinfer, shape):
    proc = subprocess.run([qinfer, "bench", "--shape", shape, "--print-config"], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"{qinfer} bench --shape {shape} --print-config: exit {proc.returncode}: "
                           f"{tail(proc.stderr, 1000)}")
    return json.loads(proc.stdout)

# ---------------------------------------------------------------------------------------------------
# PyTorch baseline (torch and transformers are imported here only: the rest runs anywhere)


def build_model(torch, transformers, hf_config):
    with tempfile.TemporaryDirectory() as d:  # from_pretrained on a folder is the path the golden tools proved
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(hf_config, f)
        config = transformers.AutoConfig.from_pretrained(d)
    text = config.get_text_config()  # Qwen3.5: the text_config sub-config; flat configs return themselves
    cls = getattr(transformers, HF_CAUSAL_LM.get(text.model_type, ""), None)
    make = ((lambda: cls._from_config(text, attn_implementation="sdpa", dtype=torch.bfloat16)) if cls else
            (lambda: transformers.AutoModelForCausalLM.from_config(text, attn_implementation="sdpa",
                                                                    dtype=torch.bfloat16)))
    torch.manual_seed(0)
    with torch.device("cuda"):  # built in place: a 35B model through host memory takes minutes
        model = make()
    model.eval()
    # Values do not change the speed, but they must stay finite; some parameters (fused experts) may be
    # left as torch.empty by the constructor, so every matrix is drawn again, as HF's init would (N(0, 0.02)).
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            elif not torch.isfinite(p).all():
                p.fill_(1.0)
    return model, text


def time_prefill(torch, model, vocab, tokens, runs=3):
    ids = torch.randint(0, vocab, (1, tokens), device="cuda")
    times = []
    with torch.no_grad():
        for i in range(runs + 1):  # the first run warms up (cuBLAS heuristics, allocator)
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model(input_ids=ids, use_cache=False, logits_to_keep=1)  # qinfer computes only the last logits
            torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - t)
        finite = bool(torch.isfinite(out.logits).all())
    s = statistics.median(times)
    return {"tokens": tokens, "seconds": round(s, 5), "tok_s": round(tokens / s, 1), "logits_finite": finite}


def time_generate(torch, transformers, model, vocab, batch, steps, cache, compile_ok):
    """One greedy generate of `steps` tokens after DECODE_PROMPT random tokens: a stopping criterion takes a
    synchronized timestamp after every token, so prefill (before the first one) is left out of the timing."""
    class StepClock(transformers.StoppingCriteria):
        def __init__(self):
            self.times = []

        def __call__(self, input_ids, scores, **kwargs):
            torch.cuda.synchronize()  # generate syncs every step anyway (its all-finished check)
            self.times.append(time.perf_counter())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    gen = copy.deepcopy(model.generation_config)
    gen.max_new_tokens = gen.min_new_tokens = steps
    gen.do_sample, gen.num_beams, gen.use_cache = False, 1, True
    gen.pad_token_id = 0 if gen.pad_token_id is None else gen.pad_token_id
    gen.cache_implementation = cache
    gen.disable_compile = not compile_ok  # generate compiles the decode step itself when the cache allows it
    gen.return_dict_in_generate = True
    ids = torch.randint(0, vocab, (batch, DECODE_PROMPT), device="cuda")
    clock = StepClock()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen,
                             stopping_criteria=transformers.StoppingCriteriaList([clock]))
    generated = out.sequences.shape[1] - DECODE_PROMPT
    cache_class = type(out.past_key_values).__name__ if out.past_key_values is not None else None
    del out
    if generated != steps or len(clock.times) < 2:
        raise RuntimeError(f"generate made {generated} tokens ({len(clock.times)} timed), asked for {steps}")
    return (clock.times[-1] - clock.times[0]) / (len(clock.times) - 1), cache_class


def time_decode(torch, transformers, model, vocab, batch, steps, try_compile):
    """Static cache + torch.compile where transformers allows it, else static eager, else the model's default
    cache in eager mode; each failure is recorded with its reason."""
    attempts = ([("static", True)] if try_compile else []) + [("static", False), (None, False)]
    failures = []
    for cache, compiled in attempts:
        label = f"{cache or 'default'} cache, {'torch.compile' if compiled else 'eager'}"
        try:
            t = time.perf_counter()
            time_generate(torch, transformers, model, vocab, batch, steps, cache, compiled)  # warm-up / compile
            warmup_s = time.perf_counter() - t
            did_compile = compiled and getattr(model, "_compiled_call", None) is not None
            runs = [time_generate(torch, transformers, model, vocab, batch, steps, cache, compiled)
                    for _ in range(2)]
            step_s, cache_class = min(runs, key=lambda r: r[0])
            if compiled and not did_compile:
                failures.append(f"{label}: generate did not compile the decode step")
            return {"batch": batch, "steps": steps - 1, "ms_per_step": round(step_s * 1e3, 3),
                    "tok_s": round(batch / step_s, 1), "cache_class": cache_class,
                    "short_mode": f"{cache or 'default'} cache, {'compiled' if did_compile else 'eager'}",
                    "compile_config": repr(getattr(model, "_last_compile_config", None)) if did_compile else None,
                    "warmup_s": round(warmup_s, 1), "failed_modes": failures}
        except Exception as e:  # noqa: BLE001 -- any failure means: try the next, simpler mode
            failures.append(f"{label}: {type(e).__name__}: {tail(str(e), 400)}")
            log(f"decode batch {batch} [{label}] failed: {failures[-1]}")
            torch._dynamo.reset()
            torch.cuda.empty_cache()
    return {"batch": batch, "error": "; ".join(failures)}


def fla_available(transformers):
    """Without flash-linear-attention, Qwen3.5's Gated DeltaNet runs transformers' pure-PyTorch fallback."""
    try:
        from transformers.utils import import_utils
        return bool(import_utils.is_flash_linear_attention_available())
    except Exception:  # noqa: BLE001 -- older or newer transformers: unknown, not fatal
        return None


def torch_baseline(torch, transformers, qinfer, shape, batches, steps, try_compile, save):
    """`save(part)` runs after every measurement, so a call cut short by the device limit keeps them."""
    part = {"result": None, "at": now()}
    model = None
    try:
        hf_config = qinfer_config(qinfer, shape)
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        model, text = build_model(torch, transformers, hf_config)
        res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "transformers": transformers.__version__, "model_class": type(model).__name__,
               "attn_implementation": getattr(model.config, "_attn_implementation", None),
               "experts_implementation": getattr(model.config, "_experts_implementation", None),
               "params_b": round(sum(p.numel() for p in model.parameters()) / 1e9, 3),
               "fla_kernels": fla_available(transformers),
               "build_s": round(time.perf_counter() - t, 1), "prefill": [], "decode": []}
        part["result"] = res
        save(part)
        log(f"torch: {res['model_class']} {res['params_b']} B params built in {res['build_s']} s")
        vocab = min(text.vocab_size, 100000)  # random ids below any special token
        for n in PREFILL_TOKENS:
            try:
                res["prefill"].append(time_prefill(torch, model, vocab, n))
            except torch.cuda.OutOfMemoryError as e:
                res["prefill"].append({"tokens": n, "error": f"out of memory: {tail(str(e), 300)}"})
            except Exception as e:  # noqa: BLE001 -- record and go on to decode
                res["prefill"].append({"tokens": n, "error": f"{type(e).__name__}: {tail(str(e), 400)}"})
            torch.cuda.empty_cache()
            save(part)
            log(f"torch prefill {n}: {res['prefill'][-1]}")
        for b in batches:
            res["decode"].append(time_decode(torch, transformers, model, vocab, b, steps, try_compile))
            save(part)
            log(f"torch decode batch {b}: {res['decode'][-1]}")
        res["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 1)
    except Exception as e:  # noqa: BLE001 -- the qinfer numbers of this shape are still worth keeping
        part["error"] = f"{type(e).__name__}: {tail(str(e), 600)}\n{tail(traceback.format_exc(), 1500)}"
        log(f"torch baseline failed: {part['error']}")
    finally:
        del model  # the next shape's qinfer run needs the GPU memory back
        gc.collect()
        torch._dynamo.reset()  # drops compiled graphs and their CUDA-graph pools
        torch.cuda.empty_cache()
    return part

# ---------------------------------------------------------------------------------------------------
# --dry-run: plausible fake numbers, to check the merge and table code without a GPU


def fake(shape, salt):
    return 0.5 + int(hashlib.sha256(f"{shape}/{salt}".encode()).hexdigest()[:8], 16) / 2**32


def fake_qinfer(shape, variant):
    if shape == "qwen3_5-27b" and variant == "4bit":
        return {"result": None, "error": "exit status 1: (dry run) an example failure", "at": now()}
    w = fake(shape, variant) * (1 if variant == "bf16" else 3.5)
    decode = [{"batch": b, "ms_per_step": 5 / w, "tok_s": 200 * w * b ** 0.8, "gbs": 3000 * min(w, 1.3),
               "fraction_of_probe": 0.7 * min(w, 1.3)} for b in (1, 8, 32)]
    return {"result": {"model": shape, "weights": "bf16" if variant == "bf16" else "MLX affine 4-bit g64",
                       "device": "NVIDIA H200 (dry run)", "copy_probe_gbs": 4300.0,
                       "prefill": [{"tokens": n, "tok_s": 15000 * w} for n in PREFILL_TOKENS], "decode": decode},
            "at": now()}


def fake_baseline(shape):
    w = fake(shape, "torch")
    prefill = [{"tokens": n, "tok_s": 9000 * w} for n in PREFILL_TOKENS]
    if "35b" in shape:
        prefill[1] = {"tokens": 8192, "error": "out of memory: (dry run)"}
    decode = [{"batch": 1, "tok_s": 90 * w, "ms_per_step": 11 / w, "short_mode": "static cache, compiled"},
              {"batch": 8, "tok_s": 600 * w, "ms_per_step": 13 / w, "short_mode": "static cache, compiled"}]
    if shape.startswith("qwen3_5"):
        for d in decode:
            d["short_mode"] = "default cache, eager"
            d["failed_modes"] = ["static cache, torch.compile: (dry run) not supported"]
    return {"result": {"device": "NVIDIA H200 (dry run)", "torch": "-", "transformers": "-", "prefill": prefill,
                       "decode": decode}, "at": now()}

# ---------------------------------------------------------------------------------------------------
# Table


def num(x):
    if x is None:
        return "—"
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}"


def by(items, key, value):
    return next((i for i in items or [] if i.get(key) == value), {})


def cell(entry, field="tok_s"):
    return "err" if "error" in entry else num(entry.get(field)) if entry else "—"


def render_table(doc):
    order = {s: i for i, s in enumerate(SHAPES)}
    keys = sorted(doc["entries"], key=lambda k: (order.get(k.split("/")[0], len(SHAPES)), k.split("/")[0],
                                                 list(VARIANT_ARGS).index(k.split("/")[1])
                                                 if k.split("/")[1] in VARIANT_ARGS else 9))
    head = ["shape", "weights", "qinfer bs1 tok/s", "GB/s", "of copy probe", "qinfer bs8 / bs32 tok/s",
            "qinfer prefill 512 / 8192 tok/s", "PyTorch bs1 tok/s (mode)", "PyTorch bs8 tok/s",
            "PyTorch prefill 512 / 8192 tok/s", "qinfer / PyTorch bs1"]
    rows, notes, devices = [], [], set()
    for k in keys:
        e = doc["entries"][k]
        shape, variant = e["shape"], e["variant"]
        q = (e.get("qinfer") or {}).get("result") or {}
        if (e.get("qinfer") or {}).get("error"):
            lines = [x for x in e["qinfer"]["error"].strip().splitlines() if x.strip()]
            pick = [x for x in lines if "error" in x.lower()] or lines  # qinfer's own message, not progress
            notes.append(f"{k} qinfer: {pick[-1][:300]}")
        # PyTorch always runs bf16 weights: the 4-bit row is compared against the bf16 baseline of its shape
        bpart = (doc["entries"].get(f"{shape}/bf16") or {}).get("baseline") or {}
        b = bpart.get("result") or {}
        if variant == "bf16" and bpart.get("error"):
            notes.append(f"{k} PyTorch: {bpart['error'].strip().splitlines()[0][:300]}")
        devices.update(x for x in (q.get("device"), b.get("device")) if x)
        qd1, bd1 = by(q.get("decode"), "batch", 1), by(b.get("decode"), "batch", 1)
        for d in b.get("decode") or []:
            if variant == "bf16" and (d.get("error") or d.get("failed_modes")):
                notes.append(f"{k} PyTorch decode bs{d['batch']}: " + (d.get("error") or
                             "fell back to " + d.get("short_mode", "?") + " after " + "; ".join(d["failed_modes"])))
        for p in b.get("prefill") or []:
            if variant == "bf16" and p.get("error"):
                notes.append(f"{k} PyTorch prefill {p['tokens']}: {p['error'][:200]}")
        frac = qd1.get("fraction_of_probe")
        ratio = (qd1["tok_s"] / bd1["tok_s"]) if qd1.get("tok_s") and bd1.get("tok_s") else None
        torch_cells = ([cell(bd1) + (f" ({bd1['short_mode']})" if bd1.get("short_mode") else ""),
                        cell(by(b.get("decode"), "batch", 8)),
                        " / ".join(cell(by(b.get("prefill"), "tokens", n)) for n in PREFILL_TOKENS)]
                       if variant == "bf16" and b else ["—", "—", "—"])
        rows.append([
            shape, q.get("weights") or variant, cell(qd1), cell(qd1, "gbs"),
            f"{frac * 100:.0f}%" if frac is not None else "—",
            " / ".join(cell(by(q.get("decode"), "batch", n)) for n in (8, 32)),
            " / ".join(cell(by(q.get("prefill"), "tokens", n)) for n in PREFILL_TOKENS),
            *torch_cells, f"{ratio:.2f}×" if ratio else "—"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if devices:
        lines.append(f"\nMachine: {', '.join(sorted(devices))}. PyTorch: transformers, bf16, sdpa, random weights; "
                     "decode after a 512-token prompt; 4-bit rows are compared with the bf16 PyTorch baseline; "
                     "decode tok/s counts every sequence of the batch.")
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines)

# ---------------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SHAPES), help="comma list (default: all five)")
    ap.add_argument("--variants", default="bf16,4bit", help="comma list of bf16, 4bit")
    ap.add_argument("--qinfer", default="build-gpu/qinfer", help="qinfer binary (default build-gpu/qinfer)")
    default_out = os.path.join(os.environ["OUT"], "bench_shapes.json") if os.environ.get("OUT") else "bench_shapes.json"
    ap.add_argument("--out", default=default_out, help="results JSON, merged into if it exists")
    ap.add_argument("--skip-torch", action="store_true", help="no PyTorch baseline")
    ap.add_argument("--skip-qinfer", action="store_true", help="no qinfer run")
    ap.add_argument("--torch-decode-steps", type=int, default=128)
    ap.add_argument("--torch-batch", default="1,8", help="PyTorch decode batch sizes (default 1,8)")
    ap.add_argument("--torch-eager", action="store_true",
                    help="skip the torch.compile attempt (its compile takes minutes per batch size)")
    ap.add_argument("--dry-run", action="store_true", help="fake numbers, no torch, no qinfer: tests merge + table")
    ap.add_argument("--merge", nargs="+", metavar="FILE", help="merge these results files into --out, print the "
                                                                "table and exit (runs nothing)")
    ap.add_argument("--table", action="store_true", help="print the table of --out and exit")
    ap.add_argument("--gpus", help="comma list of GPU indices: the shapes spread over them, one run per GPU at "
                                   "once (each sees only its GPU), results merged into --out")
    args = ap.parse_args()

    doc = load_results(args.out)
    if args.merge or args.table:
        for path in args.merge or []:
            for entry in load_results(path)["entries"].values():
                for part in ("qinfer", "baseline"):
                    if part in entry:
                        merge_part(doc, entry["shape"], entry["variant"], part, entry[part])
        if args.merge:
            save_results(args.out, doc)
        print(render_table(doc))
        return 0

    shapes = [s for s in args.shapes.split(",") if s]
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANT_ARGS]
    if bad:
        ap.error(f"--variants: unknown {bad}; choose from {list(VARIANT_ARGS)}")
    if args.gpus:
        return run_on_gpus(args, sys.argv[1:], shapes, variants)
    batches = [int(b) for b in args.torch_batch.split(",") if b]
    torch = transformers = None
    for shape in shapes:
        for variant in variants:
            if not args.skip_qinfer:
                part = fake_qinfer(shape, variant) if args.dry_run else run_qinfer(args.qinfer, shape, variant)
                merge_part(doc, shape, variant, "qinfer", part)
                save_results(args.out, doc)
                log(f"{shape}/{variant} qinfer: " + (part.get("error") or "ok")[:300])
            if args.skip_torch:
                continue
            if variant != "bf16":
                merge_part(doc, shape, variant, "baseline", {
                    "result": None, "at": now(),
                    "reason": "transformers cannot run MLX affine 4-bit weights; compare with the bf16 baseline"})
            elif args.dry_run:
                merge_part(doc, shape, variant, "baseline", fake_baseline(shape))
            else:
                if torch is None:  # imported only now, after qinfer had the GPU to itself
                    import torch
                    import transformers

                def save(part):
                    merge_part(doc, shape, variant, "baseline", part)
                    save_results(args.out, doc)

                save(torch_baseline(torch, transformers, args.qinfer, shape, batches, args.torch_decode_steps,
                                    not args.torch_eager, save))
            save_results(args.out, doc)
    print(render_table(doc))
    log(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
