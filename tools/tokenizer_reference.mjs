#!/usr/bin/env node
// Reference token ids from HF's JS tokenizers (@huggingface/tokenizers 0.2.0) for qinfer's tokenizer tests.
//
//   mkdir -p /tmp/tokref && (cd /tmp/tokref && npm install @huggingface/tokenizers@0.2.0)
//   node tools/tokenizer_reference.mjs --module /tmp/tokref/node_modules/@huggingface/tokenizers \
//       --tokenizer .deps/qwen3-tokenizer --strings tests/tokenizer/data/strings.jsonl \
//       > tests/tokenizer/data/qwen3_expected.jsonl
//   node tools/tokenizer_reference.mjs --module ... --tokenizer DIR --strings FILE --bench
//
// Writes one line per input string: {"ids": [...], "decoded": "...", "decoded_skip_special": "..."}.
// --bench encodes the strings joined by "\n" and repeated to 10 MiB, as one text, on this thread, and
// prints MB/s (tokenizer_bench does the same in C++).
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

function parseArgs(argv) {
  const args = { bench: false };
  for (let i = 2; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--bench") args.bench = true;
    else if (["--module", "--tokenizer", "--strings"].includes(a) && i + 1 < argv.length) args[a.slice(2)] = argv[++i];
    else throw new Error(`unknown argument ${a}`);
  }
  for (const need of ["module", "tokenizer", "strings"]) {
    if (!args[need]) throw new Error(`--${need} is required`);
  }
  return args;
}

const args = parseArgs(process.argv);
const pkg = JSON.parse(fs.readFileSync(path.join(args.module, "package.json"), "utf8"));
if (pkg.name !== "@huggingface/tokenizers" || pkg.version !== "0.2.0") {
  throw new Error(`expected @huggingface/tokenizers 0.2.0 at ${args.module}, found ${pkg.name} ${pkg.version}`);
}
const { Tokenizer } = await import(pathToFileURL(path.join(args.module, "dist", "tokenizers.mjs")).href);

const tokenizerJson = JSON.parse(fs.readFileSync(path.join(args.tokenizer, "tokenizer.json"), "utf8"));
const configPath = path.join(args.tokenizer, "tokenizer_config.json");
const config = fs.existsSync(configPath) ? JSON.parse(fs.readFileSync(configPath, "utf8")) : {};
const tokenizer = new Tokenizer(tokenizerJson, config);

const strings = fs.readFileSync(args.strings, "utf8").split("\n").filter((l) => l.length > 0).map((l) => JSON.parse(l));

const decode = (ids, skip) =>
  ids.length === 0 ? "" : tokenizer.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });

if (args.bench) {
  const unit = strings.join("\n") + "\n";
  const unitBytes = Buffer.byteLength(unit, "utf8");
  const copies = Math.ceil((10 * 1024 * 1024) / unitBytes);
  const text = unit.repeat(copies);
  const bytes = unitBytes * copies;
  tokenizer.encode(unit);  // warm-up
  const times = [];
  let tokens = 0;
  for (let run = 0; run < 3; ++run) {
    const start = process.hrtime.bigint();
    tokens = tokenizer.encode(text).ids.length;
    times.push(Number(process.hrtime.bigint() - start) / 1e9);
  }
  times.sort((a, b) => a - b);
  const median = times[1];
  console.log(`@huggingface/tokenizers 0.2.0 (node ${process.version}): ${(bytes / 1e6).toFixed(1)} MB -> ${tokens} tokens ` +
    `in ${median.toFixed(3)} s (median of 3): ${(bytes / 1e6 / median).toFixed(2)} MB/s`);
} else {
  const out = [];
  for (const s of strings) {
    const ids = tokenizer.encode(s).ids;
    out.push(JSON.stringify({ ids, decoded: decode(ids, false), decoded_skip_special: decode(ids, true) }));
  }
  process.stdout.write(out.join("\n") + "\n");
}
