#!/usr/bin/env python3
"""Cross-check of tools/tokenizer_reference.mjs against HF tokenizers itself (the Rust library's
Python binding; the GPU machine has it). Same output format, one line per input string:

  python3 tools/tokenizer_reference_hf.py TOKENIZER_DIR STRINGS.jsonl > OUT.jsonl
"""
import json
import sys

import tokenizers


def main():
    directory, strings_path = sys.argv[1], sys.argv[2]
    tok = tokenizers.Tokenizer.from_file(f"{directory}/tokenizer.json")
    with open(strings_path, encoding="utf-8") as f:
        strings = [json.loads(line) for line in f if line.strip()]
    print(f"tokenizers {tokenizers.__version__}", file=sys.stderr)
    for s in strings:
        ids = tok.encode(s).ids
        print(json.dumps({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                          "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)}, ensure_ascii=False))


if __name__ == "__main__":
    main()
