#!/usr/bin/env python3
"""What a state-checkpoint interval costs and buys, measured on a running `qinfer serve` (one setting).

Cost: the TTFT of cold prompts of --long ids (max_tokens 1), the median of --repeats, and the prefill
tok/s it gives. Gain: for each --shared length L, a request of L shared ids + --suffix of its own,
then another of the same L ids + a different suffix: the second's cached prompt tokens (a hybrid model
reuses up to its deepest checkpoint inside the shared part: an interval multiple, unless the first
request's end or a junction lies there) and its TTFT. Prints one JSON object.

    python3 tools/interval_probe.py --url http://127.0.0.1:8000/v1 --long 8192 --shared 1500,3000,6000

Python standard library only, on loadgen.py's HTTP client (tools/gpu_bench/interval_sweep.sh runs it
for each interval).
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadgen import Client, RequestFailed, add_server_arguments, first_model  # noqa: E402
from multiturn_bench import add_id_arguments, check_id_range, stream  # noqa: E402


async def run(args):
    client = Client(args.url, args.api_key)
    model = args.model or await first_model(client)
    rng = random.Random(args.seed)
    low, high = args.id_range

    def ids(n):
        return [rng.randrange(low, high) for _ in range(n)]

    cold = []
    for _ in range(args.repeats):
        ttft, _, cached = await stream(client, model, ids(args.long), 1)
        if cached:
            raise RequestFailed(f"a cold prompt of random ids reported {cached} cached tokens")
        cold.append(ttft)
    median = statistics.median(cold)
    shared = []
    for length in args.shared:
        prefix = ids(length)
        await stream(client, model, prefix + ids(args.suffix), 1)
        ttft, _, cached = await stream(client, model, prefix + ids(args.suffix), 1)
        shared.append({"shared_tokens": length, "cached_tokens": cached, "ttft_ms": round(ttft, 2),
                       "missed_tokens": length // 16 * 16 - (cached or 0)})
    return {"model": model, "long_tokens": args.long, "cold_ttft_ms": [round(t, 2) for t in cold],
            "cold_ttft_median_ms": round(median, 2), "prefill_tok_s": round(args.long / median * 1e3, 1),
            "suffix_tokens": args.suffix, "shared": shared}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    add_id_arguments(p)
    p.add_argument("--long", type=int, default=8192, help="ids of each cold prompt (default %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="cold prompts (default %(default)s)")
    p.add_argument("--shared", type=lambda s: [int(x) for x in s.split(",")], default=[1500, 3000, 6000],
                   help="shared prefix lengths, comma-separated (default 1500,3000,6000)")
    p.add_argument("--suffix", type=int, default=300, help="each request's own ids after the prefix (default %(default)s)")
    args = p.parse_args()
    if args.long <= 0 or args.repeats <= 0 or args.suffix <= 0 or any(n <= 0 for n in args.shared):
        p.error("--long, --repeats, --suffix and every --shared length must be positive")
    check_id_range(p, args)
    return args


def main():
    args = parse_args()
    try:
        print(json.dumps(asyncio.run(run(args))))
    except (RequestFailed, OSError, ValueError) as e:
        print(f"interval_probe: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
