#!/usr/bin/env python3
"""Multi-turn prefix-cache benchmark for `qinfer serve` (or any server with vLLM's return_token_ids).

One conversation as chat clients and agents send it: every turn resends everything so far (the last
prompt, the reply's token ids) plus a new user message, and streams a reply. Beside each turn the same
prompt is sent cold: its first token changed, so it shares nothing with anything cached and the server
computes it whole. Reports each turn's TTFT both ways, the cached tokens the server reported, and the
ratio; exit status 1 when a request failed or (with --floor) a turn from --floor-from on has
cached TTFT above --floor x cold.

    python3 tools/multiturn_bench.py --url http://127.0.0.1:8000/v1 --turns 20 --user-tokens 64 \\
        --reply-tokens 336 --json

Prompts are token ids (the completions endpoint), so a reply re-enters the next turn exactly as it was
generated, whatever the model's weights; ids are drawn from --id-range (plain text ids of the Qwen
vocabulary by default). Python standard library only, on loadgen.py's HTTP client.
"""

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loadgen import Client, RequestFailed, add_server_arguments, error_message, first_model, sse_events  # noqa: E402


async def stream(client, model, prompt, max_tokens):
    """One streamed completion of `prompt` (ids): (TTFT ms, generated ids, cached prompt tokens)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "return_token_ids": True}
    start = time.perf_counter()
    response = await client.send("POST", "/completions", body)
    try:
        if response.status != 200:
            raise RequestFailed(error_message(response.status, await response.body(64 << 10)))
        buffer, ids, first, cached, done = bytearray(), [], None, None, False
        async for data in response.chunks():
            now = time.perf_counter()
            buffer += data
            for event in sse_events(buffer):
                if event == "[DONE]":
                    done = True
                    continue
                chunk = json.loads(event)
                if chunk.get("error"):
                    raise RequestFailed(f"stream error: {chunk['error']}")
                if chunk.get("usage"):
                    cached = (chunk["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                for choice in chunk.get("choices") or []:
                    new = choice.get("token_ids")
                    if new is None:
                        raise RequestFailed("the server sent no token_ids (return_token_ids unsupported?)")
                    if new and first is None:
                        first = now
                    ids += new
        if not done:
            raise RequestFailed("stream ended without data: [DONE]")
    finally:
        response.close()
    if first is None:
        raise RequestFailed("no token was generated")
    return (first - start) * 1e3, ids, cached


async def run(args):
    client = Client(args.url, args.api_key)
    model = args.model or await first_model(client)
    rng = random.Random(args.seed)
    low, high = args.id_range

    def message(n):
        return [rng.randrange(low, high) for _ in range(n)]

    prompt = message(args.user_tokens)
    turns = []
    for turn in range(1, args.turns + 1):
        # Cold first: a different first id, so nothing of it is cached, and the turn after it is unaffected.
        cold_prompt = [low + (prompt[0] - low + 1 + turn) % (high - low)] + prompt[1:]
        cold_ttft, _, cold_cached = await stream(client, model, cold_prompt, 1)
        ttft, reply, cached = await stream(client, model, prompt, args.reply_tokens)
        turns.append({"turn": turn, "prompt_tokens": len(prompt), "cached_tokens": cached,
                      "cold_cached_tokens": cold_cached, "ttft_ms": round(ttft, 2),
                      "cold_ttft_ms": round(cold_ttft, 2), "ratio": round(ttft / cold_ttft, 4)})
        if not args.json:
            t = turns[-1]
            print(f"turn {turn:3d}  prompt {len(prompt):6d}  cached {cached!s:>6}  TTFT {ttft:8.1f} ms  "
                  f"cold {cold_ttft:8.1f} ms  ratio {t['ratio']:.3f}", flush=True)
        prompt = prompt + reply + message(args.user_tokens)
    late = [t["ratio"] for t in turns if t["turn"] >= args.floor_from]
    summary = {"model": model, "turns": turns, "user_tokens": args.user_tokens, "reply_tokens": args.reply_tokens,
               "median_ratio_from_floor_turn": round(statistics.median(late), 4) if late else None,
               "worst_ratio_from_floor_turn": max(late) if late else None, "floor_from": args.floor_from,
               "floor": args.floor}
    summary["floor_met"] = None if args.floor is None or not late else summary["worst_ratio_from_floor_turn"] <= args.floor
    return summary


def add_id_arguments(p):
    """--id-range and --seed: where a tool's random token ids come from (multiturn_bench, interval_probe)."""
    p.add_argument("--id-range", type=lambda s: tuple(int(x) for x in s.split(",")), default=(1000, 100000),
                   help="LOW,HIGH: ids are drawn from [LOW, HIGH) (default 1000,100000)")
    p.add_argument("--seed", type=int, default=1)


def check_id_range(p, args):
    if len(args.id_range) != 2 or not 0 <= args.id_range[0] < args.id_range[1]:
        p.error("--id-range: expected LOW,HIGH with 0 <= LOW < HIGH")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    add_id_arguments(p)
    p.add_argument("--turns", type=int, default=20, help="default %(default)s")
    p.add_argument("--user-tokens", type=int, default=64, help="ids each turn's new message adds (default %(default)s)")
    p.add_argument("--reply-tokens", type=int, default=336, help="ids each reply adds (default %(default)s)")
    p.add_argument("--floor", type=float, help="fail when a turn's cached TTFT / cold TTFT exceeds this")
    p.add_argument("--floor-from", type=int, default=5, help="first turn the floor applies to (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the per-turn lines")
    args = p.parse_args()
    if args.turns <= 0 or args.user_tokens <= 0 or args.reply_tokens <= 0:
        p.error("--turns, --user-tokens and --reply-tokens must be positive")
    check_id_range(p, args)
    return args


def main():
    args = parse_args()
    try:
        summary = asyncio.run(run(args))
    except (RequestFailed, OSError, ValueError) as e:
        print(f"multiturn_bench: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary))
    else:
        print(f"median cached/cold TTFT from turn {args.floor_from}: {summary['median_ratio_from_floor_turn']}, "
              f"worst {summary['worst_ratio_from_floor_turn']}")
    return 0 if summary["floor_met"] in (None, True) else 1


if __name__ == "__main__":
    sys.exit(main())
