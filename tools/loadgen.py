#!/usr/bin/env python3
"""Load generator for `qinfer serve` (or any OpenAI-compatible server).

At each concurrency level it keeps that many streaming requests in flight and reports output tok/s,
time to first token (TTFT), inter-token latency (ITL) and time per output token (TPOT) percentiles.
Python standard library only (3.11+): asyncio with one raw HTTP/1.1 connection per request, so it runs
wherever python3 does.

    python3 tools/loadgen.py --url http://127.0.0.1:8000/v1 --concurrency 1,16,64,256 --max-tokens 128

TTFT and ITL are taken when the bytes of an event arrive; TPOT is each request's (last - first token
time) / (tokens - 1), which does not depend on how the network batches events. Output tokens come from
the stream's usage block (stream_options.include_usage) when the server sends one, else from the number
of content-bearing deltas; the output says which. Exit status 1 when any request failed.
"""

import argparse
import asyncio
import json
import math
import os
import random
import ssl
import sys
import time
import urllib.parse

# Random words, so requests share no prefix beyond the template.
VOCABULARY = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
    "quebec romeo sierra tango uniform victor whiskey xray yankee zulu"
).split()


class RequestFailed(Exception):
    pass


class Response:
    """An HTTP/1.1 response whose body is read incrementally (chunked, Content-Length or until close)."""

    def __init__(self, reader, writer, status, headers):
        self.reader, self.writer, self.status, self.headers = reader, writer, status, headers

    async def chunks(self):
        r = self.reader
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = await r.readuntil(b"\r\n")
                size = int(size_line.split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while (await r.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the final empty line
                        pass
                    return
                # Yield a chunk's bytes as they come rather than waiting for all of it.
                while size > 0:
                    data = await r.read(min(size, 65536))
                    if not data:
                        raise RequestFailed("connection closed inside a chunk")
                    size -= len(data)
                    yield data
                if await r.readexactly(2) != b"\r\n":
                    raise RequestFailed("malformed chunked encoding")
        elif "content-length" in self.headers:
            left = int(self.headers["content-length"])
            while left > 0:
                data = await r.read(min(left, 65536))
                if not data:
                    raise RequestFailed(f"connection closed with {left} body bytes missing")
                left -= len(data)
                yield data
        else:
            while data := await r.read(65536):
                yield data

    async def body(self, limit=1 << 20):
        out = bytearray()
        async for data in self.chunks():
            out += data
            if len(out) >= limit:
                break
        return bytes(out)

    def close(self):
        self.writer.close()


class Client:
    def __init__(self, url, api_key):
        parts = urllib.parse.urlsplit(url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SystemExit(f"--url: expected http://host[:port]/path, got {url!r}")
        self.base = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path
        self.host_header = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literals keep their brackets
        if parts.port:
            self.host_header += f":{parts.port}"
        self.api_key = api_key

    async def send(self, method, path, payload=None):
        reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 20)
        try:
            body = b"" if payload is None else json.dumps(payload).encode()
            head = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}", "Connection: close",
                    "Accept: application/json, text/event-stream"]
            if payload is not None:
                head += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
            if self.api_key:
                head.append(f"Authorization: Bearer {self.api_key}")
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            fields = status_line.decode("latin-1").split(None, 2)
            if len(fields) < 2 or not fields[0].startswith("HTTP/") or not fields[1].isdigit():
                raise RequestFailed(f"not an HTTP response: {status_line[:80]!r}")
            headers = {}
            while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            return Response(reader, writer, int(fields[1]), headers)
        except BaseException:
            writer.close()
            raise


def error_message(status, body):
    """`HTTP <status>: <message>`, the message taken from an OpenAI-style error body when there is one."""
    text = body.decode("utf-8", "replace")
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text.strip()[:200]
    return f"HTTP {status}: {message}"


async def first_model(client):
    response = await client.send("GET", "/models")
    try:
        body = await response.body()
    finally:
        response.close()
    if response.status != 200:
        raise RequestFailed(f"GET {client.base}/models: {error_message(response.status, body)}")
    return json.loads(body)["data"][0]["id"]


def sse_events(buffer):
    """Splits the complete events off the front of `buffer` (a bytearray, consumed in place) and returns
    their `data:` payloads; an unfinished event stays in the buffer and is parsed again after the next read."""
    events, data_lines = [], []
    start = consumed = 0
    while (end := buffer.find(b"\n", start)) >= 0:
        line = bytes(buffer[start:end]).rstrip(b"\r")
        start = end + 1
        if not line:
            if data_lines:
                events.append(b"\n".join(data_lines).decode("utf-8"))
            data_lines = []
            consumed = start
        elif line.startswith(b"data:"):
            value = line[5:]
            data_lines.append(value[1:] if value.startswith(b" ") else value)
    del buffer[:consumed]
    return events


def produced(choice):
    delta = choice.get("delta") or {}
    return bool(choice.get("text") or delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


async def one(client, model, args):
    """One streamed request; returns its token times and counts, or raises RequestFailed."""
    words = " ".join(random.choice(VOCABULARY) for _ in range(args.prompt_words))
    body = {"model": model, "max_tokens": args.max_tokens, "temperature": args.temperature, "stream": True,
            "stream_options": {"include_usage": True}}
    if args.ignore_eos == "true":
        body["ignore_eos"] = True  # vLLM's extension field: every request generates max_tokens
    extra = dict(args.extra_body)
    leading = extra.pop("messages", [])  # e.g. a system message, put before each request's own
    body.update(extra)  # e.g. a structured-output constraint
    if args.endpoint == "chat":
        body["messages"] = leading + [{"role": "user", "content": f"Continue this list: {words}"}]
    else:
        body["prompt"] = f"Continue this list: {words}"
    start = time.perf_counter()
    response = await client.send("POST", "/chat/completions" if args.endpoint == "chat" else "/completions", body)
    try:
        if response.status != 200:
            raise RequestFailed(error_message(response.status, await response.body(64 << 10)))
        buffer = bytearray()
        first = last = None
        gaps = []
        usage_tokens = None
        delta_tokens = 0
        done = False
        async for data in response.chunks():
            now = time.perf_counter()  # every event completed by this read arrived now
            buffer += data
            for event in sse_events(buffer):
                if event == "[DONE]":
                    done = True
                    continue
                try:
                    chunk = json.loads(event)
                except ValueError:
                    chunk = None
                if not isinstance(chunk, dict):
                    raise RequestFailed(f"malformed event: {event[:200]}")
                if chunk.get("error"):
                    error = chunk["error"]
                    raise RequestFailed(f"stream error: {error.get('message', error) if isinstance(error, dict) else error}")
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                n = sum(1 for c in chunk.get("choices") or [] if produced(c))
                if n == 0:
                    continue
                delta_tokens += n
                if first is None:
                    first = now
                else:
                    gaps.append((now - last) * 1e3)
                last = now
        if not done:
            raise RequestFailed("stream ended without data: [DONE]")
    finally:
        response.close()
    tokens = usage_tokens if usage_tokens is not None else delta_tokens
    return {
        "ttft": None if first is None else (first - start) * 1e3,
        "gaps": gaps,
        "tokens": tokens,
        "from_usage": usage_tokens is not None,
        "tpot": (last - first) * 1e3 / (tokens - 1) if first is not None and tokens > 1 else None,
    }


def percentiles(values):
    """Nearest-rank p50 / p90 / p99 in ms; None when there are no values."""
    values = sorted(values)

    def at(p):
        if not values:
            return None
        return round(values[min(len(values) - 1, max(0, math.ceil(p / 100 * len(values)) - 1))], 3)

    return {"p50": at(50), "p90": at(90), "p99": at(99)}


async def level(client, model, concurrency, args):
    total = args.requests if args.requests is not None else max(8, 2 * concurrency)
    results, errors = [], []
    started = 0

    async def worker():
        nonlocal started
        while started < total:
            started += 1
            try:
                results.append(await one(client, model, args))
            except RequestFailed as e:
                errors.append(str(e))
            except asyncio.IncompleteReadError:
                errors.append("connection closed before the response ended")
            except (OSError, asyncio.LimitOverrunError, ValueError) as e:
                errors.append(f"{type(e).__name__}: {e}")

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, total))))
    seconds = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in results)
    from_usage = sum(r["from_usage"] for r in results)
    return {
        "concurrency": concurrency,
        "requests": total,
        "ok": len(results),
        "failed": len(errors),
        "seconds": round(seconds, 2),
        "output_tokens": tokens,
        "output_tok_s": round(tokens / seconds, 1),
        "requests_s": round(len(results) / seconds, 2),
        # Where output_tokens came from: the usage block, content deltas, or some of each.
        "tokens_from": "usage" if from_usage == len(results) else "deltas" if from_usage == 0 else "mixed",
        "ttft_ms": percentiles(r["ttft"] for r in results if r["ttft"] is not None),
        "itl_ms": percentiles(g for r in results for g in r["gaps"]),
        "tpot_ms": percentiles(r["tpot"] for r in results if r["tpot"] is not None),
        "first_error": errors[0] if errors else None,
    }


def concurrency_list(text):
    try:
        levels = [int(c) for c in text.split(",") if c.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of integers, got {text!r}") from None
    if not levels or any(c <= 0 for c in levels):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return levels


def add_server_arguments(p):
    """--url, --model and --api-key: the server a tool talks to (loadgen, multiturn_bench, interval_probe)."""
    p.add_argument("--url", default="http://127.0.0.1:8000/v1", help="API base URL (default %(default)s)")
    p.add_argument("--model", help="model name (default: the first of /v1/models)")
    p.add_argument("--api-key", default=os.environ.get("QINFER_API_KEY", ""), help="default $QINFER_API_KEY")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_arguments(p)
    p.add_argument("--concurrency", type=concurrency_list, default="1,16,64,256",
                   help="requests in flight, one level per value (default %(default)s)")
    p.add_argument("--requests", type=int, help="requests per level (default max(8, 2 x concurrency))")
    p.add_argument("--max-tokens", type=int, default=128, help="default %(default)s")
    p.add_argument("--prompt-words", type=int, default=64, help="default %(default)s")
    p.add_argument("--endpoint", choices=["chat", "completions"], default="chat", help="default %(default)s")
    p.add_argument("--temperature", type=float, default=1.0, help="default %(default)s")
    p.add_argument("--ignore-eos", choices=["true", "false"], default="true",
                   help="send ignore_eos so every request generates max_tokens (default %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON object per level instead of the table")
    p.add_argument("--extra-body", type=json.loads, default={},
                   help='JSON object merged into every request body, e.g. \'{"guided_grammar": "root ::= [a-z ]+"}\'; '
                        'its "messages" go before each request\'s user message')
    args = p.parse_args()
    if args.requests is not None and args.requests <= 0:
        p.error("--requests: expected a positive integer")
    return args


def fmt(x, width):
    return ("-" if x is None else f"{x:.1f}").rjust(width)


async def main():
    args = parse_args()
    client = Client(args.url, args.api_key)
    try:
        model = args.model or await first_model(client)
    except (RequestFailed, OSError, asyncio.IncompleteReadError, ValueError, KeyError, IndexError) as e:
        print(f"loadgen: cannot find a model at {client.base}/models ({type(e).__name__}: {e}); pass --model",
              file=sys.stderr)
        return 1
    if not args.json:
        print(f"model {model} at {client.base}; {args.endpoint}, max_tokens {args.max_tokens}, "
              f"~{args.prompt_words}-word prompts")
        print("conc  reqs  fail  out tok/s  req/s   TTFT p50 / p90 / p99 ms        ITL p50 / p90 / p99 ms"
              "     TPOT p50 / p90 / p99 ms  tokens")
    reports = []
    for concurrency in args.concurrency:
        r = await level(client, model, concurrency, args)
        reports.append(r)
        if args.json:
            print(json.dumps(r), flush=True)
            continue
        t, i, o = r["ttft_ms"], r["itl_ms"], r["tpot_ms"]
        print(f"{concurrency:4}  {r['requests']:4}  {r['failed']:4}  {fmt(r['output_tok_s'], 9)}  {fmt(r['requests_s'], 5)}"
              f"   {fmt(t['p50'], 8)} / {fmt(t['p90'], 8)} / {fmt(t['p99'], 8)}"
              f"   {fmt(i['p50'], 7)} / {fmt(i['p90'], 7)} / {fmt(i['p99'], 7)}"
              f"   {fmt(o['p50'], 7)} / {fmt(o['p90'], 7)} / {fmt(o['p99'], 7)}  {r['tokens_from'] if r['ok'] else '-'}",
              flush=True)
        if r["first_error"]:
            print(f"      first error: {r['first_error']}", flush=True)
    failed = sum(r["failed"] for r in reports)
    if not args.json:
        best = max(reports, key=lambda r: r["output_tok_s"])
        sources = {r["tokens_from"] for r in reports if r["ok"]}
        counted = {"usage": "the usage block", "deltas": "content deltas (the server sent no usage)",
                   "mixed": "the usage block where sent, else content deltas"}
        counted = counted[sources.pop() if len(sources) == 1 else "mixed"] if sources else "nothing (no request completed)"
        print(f"summary: {sum(r['requests'] for r in reports)} requests, {failed} failed; peak "
              f"{best['output_tok_s']:.1f} output tok/s at concurrency {best['concurrency']}; tokens counted from {counted}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
