#!/usr/bin/env python3
"""Writes the tokenizer parity inputs under tests/tokenizer/data/ (deterministic; seeded):

  strings.jsonl              hard strings for the real Qwen3 tokenizer, one JSON string per line
  qwen35_mini/tokenizer.json a small Qwen3.5-style tokenizer (its split regex adds \\p{M}), with a BPE
                             vocabulary trained here on a tiny corpus; merges in the legacy "a b" form
  qwen35_mini/tokenizer_config.json
  qwen35_mini/strings.jsonl  strings for it, combining marks first

Expected ids come from tools/tokenizer_reference.mjs. Random code points are drawn from characters
assigned in Unicode 14 (this Python's unicodedata), the version of PCRE2 10.42's tables.
Needs the `regex` module (pip) for the mini tokenizer's pre-tokenization.
"""
import json
import random
import unicodedata
from collections import Counter
from pathlib import Path

import regex

DATA = Path(__file__).resolve().parent.parent / "tests" / "tokenizer" / "data"

QWEN35_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                  r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def nfd(s):
    return unicodedata.normalize("NFD", s)


HAND = [
    # empty, single characters, basic English
    "", " ", "a", "A", ".", "\n", "Hello world", "Hello, world!", "hello   world", " hello",
    "The quick brown fox jumps over the lazy dog.",
    "THE QUICK BROWN FOX", "tHe QuIcK", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "the the the the the the", "antidisestablishmentarianism", "pneumonoultramicroscopicsilicovolcanoconiosis",
    # contractions and apostrophes
    "I'm", "don't", "she'll", "we've", "they're", "he'd", "It's", "IT'S", "'S", "'s", "y'all", "rock 'n' roll",
    "It\u2019s curly", "''''", "'", "'''s", "can't won't shan't", "I'M YOU'RE WE'VE HE'LL SHE'D",
    "it'\u017f long s", "x'T", "'re'RE'Re",
    # Latin with accents, NFC and NFD
    "Café", nfd("Café"), "café crème brûlée", nfd("café crème brûlée"), "naïve façade coöperate",
    nfd("naïve façade coöperate"), "Ångström", nfd("Ångström"), "Zoë Saldaña", "Příliš žluťoučký kůň úpěl ďábelské ódy",
    nfd("Příliš žluťoučký kůň úpěl ďábelské ódy"), "Grüße aus der Straße", "İstanbul ıi İI", "Łódź, Gdańsk",
    "Tiếng Việt có dấu", nfd("Tiếng Việt có dấu"), "a\u0300\u0301\u0302\u0303", "e\u0308\u0304", "o\u0328\u0304",
    "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034dA\u036b\u0357",
    "\u0301abc", " \u0301", "\n\u0301x", "1\u0301", "ﬁ ﬂ ﬀ ligatures", "Ǆ ǅ ǆ", "Å Å Å",
    # Greek, Cyrillic
    "Καλημέρα κόσμε", "ἐν ἀρχῇ ἦν ὁ λόγος", nfd("ἐν ἀρχῇ ἦν ὁ λόγος"), "ΣΊΣΥΦΟΣ σίσυφος ς",
    "Съешь же ещё этих мягких французских булок, да выпей чаю", "Ґґ Її Єє", "й", nfd("й ё Й Ё"),
    "Привет,мир!Как дела?", "Ѣ ѣ Ѳ ѳ Ѵ ѵ",
    # Arabic, Hebrew, Persian
    "مرحبا بالعالم", "بِسْمِ ٱللَّٰهِ ٱلرَّحْمَٰنِ ٱلرَّحِيمِ", "١٢٣٤٥٦٧٨٩٠", "۱۲۳۴ فارسی", "\u200fRTL\u200e mark",
    "שלום עולם", "בְּרֵאשִׁית בָּרָא אֱלֹהִים", "עִבְרִית123abc", "ﷺ ﷽",
    # Indic, Southeast Asian
    "नमस्ते दुनिया", "क्षत्रिय हिन्दी", "क़ ख़ ग़", "\u0915\u093c\u0916\u093c", "ক্ষ বাংলা ভাষা", "தமிழ் மொழி",
    "తెలుగు భాష", "ಕನ್ನಡ", "മലയാളം", "ગુજરાતી", "ਪੰਜਾਬੀ", "ଓଡ଼ିଆ", nfd("ଓଡ଼ିଆ"), "සිංහල",
    "สวัสดีชาวโลก", "ภาษาไทยมีวรรณยุกต์ ่ ้ ๊ ๋", "ພາສາລາວ", "ភាសាខ្មែរ", "မြန်မာဘာသာ", "བོད་ཡིག", "ᠮᠣᠩᠭᠣᠯ",
    # CJK, kana, Hangul
    "你好，世界！", "日本語のテキスト、カタカナ、ひらがな。", "中文标点符号：“引号”《书名》【括号】", "ＡＢＣ１２３ｱｲｳ",
    "𠀀𠀁𪚥𰻞", "豈 更 車 賈", "漢字かな交じり文", "我爱北京天安门。Tiananmen",
    "안녕하세요 세계", nfd("안녕하세요 세계"), nfd("한국어"), "ᄀᄀᄀ ᅡᅡ", "ㄱㄴㄷ ㅏㅑ", "\u1100\u1161\u11a8 \u1100\u1161",
    # emoji
    "👍", "👍🏽", "👍🏿👍🏻", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🏴‍☠️", "🇺🇸🇯🇵🇫🇷", "🇦", "🇦🇧🇨", "1️⃣ #️⃣ *️⃣", "❤️ ❤ ♥",
    "🧑🏿‍🚀 👩🏽‍💻", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "🫠🫶🪿", "☺︎ ☺️", "😀😃😄😁😆😅🤣😂", "emoji👍inside😀words", "🤷‍♀️",
    # whitespace of every kind
    "  ", "   ", "    a", "a    ", "\t", "\t\t x", "\n\n", "\n\n\n\n", "\r\n", "\r", "\r\r\n\n", " \n ", "a \n b",
    "a\r\n\r\nb", "line1\rline2\nline3\r\nline4", "foo   \nbar", "  leading", "x\n  y\n    z", "\n\t\t",
    "\u00a0", "a\u00a0b", "\u3000全角\u3000", "\u2003\u2002\u2009", "\u200b zero width", "\u2028\u2029",
    "a\u0085b", "\u0085", "a\ufeffb", "\ufeff", "a\u180eb", "\u180e", "\u000b\u000c", " \t\n\r\u000b\u000c",
    " " * 100, "\n" * 33, "\t" * 17 + "x", " \n" * 20, "end   ", "x" + " " * 7 + "\n" + " " * 3 + "y",
    "   \r\n   \r\n", "a\u2000\u2001\u2002b", "\u205f\u202f\u1680", "\r \r \r", "\n \n\n  \n\n\n   ",
    # digits and numbers
    "1234567890", "3.14159265358979323846", "1,000,000", "0x1F 0b1010 0o17", "2024-01-01T12:34:56Z",
    "1" * 200, "12345678901234567890123456789012345678901234567890", "①②③ ⑴⑵", "Ⅻ ⅻ", "½ ¼ ¾", "x² y³ 10⁻⁹",
    "१२३ ๑๒๓", "$1,234.56 €7,89 ¥100", "+1 (555) 123-4567", "-0.0e-10", "v1.2.3-rc.4",
    # code
    "def foo(x):\n    return x ** 2\n",
    "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size();\n}\n",
    "const f = (a, b) => { return a?.b ?? [...c]; };",
    "fn main() -> Result<(), Box<dyn Error>> {\n    println!(\"{:?}\", x);\n    Ok(())\n}",
    "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hi\") }",
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "<html><body><div class=\"x\">Hello &amp; bye</div></body></html>",
    ".btn:hover { color: #ff0000; margin: 0 auto !important; }",
    "for f in *.txt; do echo \"$f\" | sed 's/a/b/g' >> out.log; done",
    "{\"name\": \"qinfer\", \"version\": 1, \"tags\": [\"a\", \"b\"], \"nested\": {\"k\": null, \"t\": true}}",
    "key: value\nlist:\n  - one\n  - two\n",
    "\\begin{equation} E = mc^2 \\end{equation}", "all:\n\t$(CC) -o $@ $^\n",
    "--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n-old\n+new\n", "if (a && b || !c) { x += 1; } else { y -= 2; }",
    "    indented\n        more\n\ttab", "/* comment */ // line\n# hash", "a_b_c __init__ __name__ == '__main__'",
    "x=1;y=2;z=x+y", "regex: ^[a-z]+\\d{2,}$", "C:\\Users\\name\\file.txt",
    # URLs, emails, paths
    "https://example.com/path/to/page?q=1&r=two#frag", "http://localhost:8080/api/v1/chat/completions",
    "mailto:someone@example.org", "user.name+tag@sub.domain.co.uk", "/usr/local/bin/qinfer --model ./dir",
    "www.例子.测试/路径", "ftp://[2001:db8::1]:21/",
    # special tokens in text
    "<|im_start|>user\nhi<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<think>\nLet me think.\n</think>\n\nThe answer is 4.", "<think>", "</think>", "<think></think>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    "<tool_response>\nsunny\n</tool_response>", "<|im_start|", "<|im_end|", "|im_start|>", "<|im_start",
    "<|endoftext|>", "<|endoftext|><|endoftext|>", "<<|im_start|>>", "<|im_start|><|im_end|>", "<|IM_START|>",
    " <|im_start|> ", "text<|endoftext|>more text", "<think >", "< think>", "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<|vision_start|><|image_pad|><|vision_end|>", "<|unknown_token|>", "<|im_start|>assistant\n<think>\n\n</think>\n\n",
    "<|box_start|>(1,2),(3,4)<|box_end|>", "<|repo_name|>qinfer<|file_sep|>src/main.cpp", "<||>", "<|", "|>",
    "<|im_end|>\n<|im_start|>", "\n<|im_end|>\n", "   <|im_end|>   ",
    # punctuation, symbols, math
    "!!!???...", "—–-", "«»„“”‘’‹›", "∀x∈ℝ: x²≥0 ⇒ √x∈ℝ", "∑_{i=1}^{n} i = n(n+1)/2", "←↑→↓↔ ⇐⇑⇒⇓",
    "┌─┬─┐\n│a│b│\n└─┴─┘", "⠓⠑⠇⠇⠕", "𝄞𝄢 music", "𝐀𝐁𝐂 𝕏𝕐 𝒜", "𐐷𐐸 Deseret", "𐌰𐌱𐌲 Gothic", "𓀀𓁀 hieroglyphs",
    "𒀀𒀁 cuneiform", "𐀀𐀁 Linear B", "©®™℠", "°C °F ‰ ‱", "§¶†‡•", "…‥", "***___~~~```", "#$%&@^`|~",
    # controls, noncharacters, private use, odd code points
    "\u0000", "a\u0000b", "\u0001\u001f\u007f", "\u0080\u009f", "\ufdd0 \uffff \ufffe", "\U0010ffff", "\U0001fffe",
    "\ue000\uf8ff", "\U000f0000\U00100000", "\ufffd", "a\ufe0fb\ufe0e", "\u200d", "\u200c\u200d", "\u0378\u0379",
    "\U000e0001\U000e0041", "\u034f", "\u2060\u2061", "\u00ad soft hyphen",
    # byte-level alphabet characters used literally
    "ĠĠĠ", "Ġhello", "âĢĻ", "Ċ", "ĉĊĠ", "Āā",
    # long mixed
    "In 2024, the 東京 Olympics 🏅 had 11,000+ athletes; café owners said: «C'est génial!» — naïve?\n\tYes.",
    "Mixed: العربية, עברית, русский, 中文, 日本語, 한국어, ไทย, हिन्दी, Ελληνικά and English 123.",
]

# Letters newer than PCRE2 10.42's Unicode 14 tables (15.0: CJK Ext H, Kawi, Nag Mundari; 16.0: the rest).
NEWER_UNICODE = ["\U00031350\U00031351", "abc\U00011f04def", "\U0001e4d0\U0001e4d1 x", "\u088fabc",
                 "x\u0c5c\u0c3e", "\u1c89\u1c8a end", "\U00011f50\U00011f51\U00011f52"]

POOLS = {
    "latin": ["hello", "World", "café", nfd("crème"), "naïve", "Straße", "ÆØÅ", "ñandú", "Ðoàn", "ǅemal"],
    "greek": ["λόγος", "Ωμέγα", nfd("ἀρχῇ")],
    "cyrillic": ["привет", "МИР", "ёжик", nfd("йод")],
    "arabic": ["سلام", "عَرَبِيّ", "٣٤٥"],
    "hebrew": ["שָׁלוֹם", "עולם"],
    "indic": ["नमस्ते", "क़िला", "தமிழ்", "বাংলা"],
    "thai": ["สวัสดี", "ภาษา"],
    "cjk": ["你好", "世界", "日本語", "カタカナ", "ひらがな", "漢字", "𠀋"],
    "hangul": ["안녕", nfd("한글"), "각"],
    "emoji": ["👍🏽", "👨‍👩‍👧", "🇩🇪", "3️⃣", "🏳️‍⚧️", "😀", "🫡"],
    "space": [" ", "  ", "\t", "\n", "\r\n", "\r", "\u00a0", "\u3000", "\n\n", " \n", "\u2009", "     "],
    "digits": ["0", "42", "1234567", "3.14", "٩", "1e10", "00000"],
    "punct": [".", ",", "!", "?", "...", "—", "(", ")", "\"", "'", "'s", "'ll", "«", "»", "::", "->", "{}", ";"],
    "special": ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im_",
                "im_end|>", "<|", "<thi"],
    "marks": ["\u0301", "\u0308", "\u0323", "\u093c", "\u0e48", "\u05b8", "\u0651", "\u20e3", "\u0338"],
}

# Blocks to draw random code points from (only those assigned in Unicode 14 are kept).
RANGES = [(0x20, 0x7E), (0xA0, 0x24F), (0x250, 0x36F), (0x370, 0x52F), (0x591, 0x6FF), (0x900, 0xDFF),
          (0xE00, 0xEFF), (0x1100, 0x11FF), (0x1E00, 0x1FFF), (0x2000, 0x2BFF), (0x3000, 0x30FF),
          (0x4E00, 0x9FFF), (0xAC00, 0xD7A3), (0xF900, 0xFFFD), (0x10000, 0x1047F), (0x1D400, 0x1D7FF),
          (0x1F300, 0x1FAFF), (0x20000, 0x2A6DF), (0xE0000, 0xE007F), (0xF0000, 0xF00FF)]


def assigned(cp):
    return not 0xD800 <= cp <= 0xDFFF and unicodedata.category(chr(cp)) != "Cn"


def random_code_points(rng, n):
    out = []
    while len(out) < n:
        lo, hi = rng.choice(RANGES)
        cp = rng.randint(lo, hi)
        if assigned(cp):
            out.append(chr(cp))
    return "".join(out)


def generated(rng):
    out = []
    names = list(POOLS)
    for _ in range(70):  # mixtures of fragments from every pool
        out.append("".join(rng.choice(POOLS[rng.choice(names)]) for _ in range(rng.randint(3, 14))))
    for _ in range(40):  # random assigned code points, astral planes included
        out.append(random_code_points(rng, rng.randint(1, 24)))
    for _ in range(30):  # whitespace runs and newline mixes around short words
        parts = []
        for _ in range(rng.randint(2, 10)):
            parts.append("".join(rng.choice(["\n", "\r", "\r\n", " ", "\t", "\u00a0", "\u3000", "\u2003"])
                                 for _ in range(rng.randint(1, 6))))
            parts.append(rng.choice(["a", "word", "x1", "é", "中", "!", "", "\u0301"]))
        out.append("".join(parts))
    for _ in range(20):  # digits and punctuation
        out.append("".join(rng.choice("0123456789" * 2 + ".,;:-+*/=()[] ") for _ in range(rng.randint(2, 40))))
    for _ in range(20):  # letters followed by random combining marks, in NFC and NFD
        s = "".join(rng.choice("aeiouyAEIOUnNcCsSzZ") + "".join(rng.choice(POOLS["marks"] + ["\u0300", "\u0302", "\u0327"])
                    for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(2, 8)))
        out.append(s if rng.random() < 0.5 else unicodedata.normalize("NFC", s))
    for _ in range(20):  # special tokens and their fragments inside text
        out.append("".join(rng.choice(POOLS["special"] + POOLS["latin"] + POOLS["space"] + POOLS["cjk"])
                           for _ in range(rng.randint(3, 10))))
    return out


def mini_strings(rng):
    fixed = [
        "e\u0301", "cafe\u0301", "Café", "a\u0300\u0301\u0302", "\u0301", " \u0301", "\u0301\u0302x", "x \u0301y",
        "ó\u0328", "नमस्ते", "क्षत्रिय", "\u0915\u093c", "ภาษาไทย", "ไม่", "עִבְרִית", "بِسْمِ", "1\u20e3", "a\u20dd",
        "Z\u0351\u036b\u0343\u036a", "e\u0308\u0304 o\u0328", "th\u0301e", "I'm", "DON'T", "hello world", "  a  b  ",
        "line\r\nnext", "x\n\n\ty", "123 4567", "<|im_start|>user\nhi<|im_end|>", "<think>e\u0301</think>",
        "cafe\u0301 <mask> menu", "x<mask>y", "a <mask>   b", "\u3000<mask>\u3000", "café", "cafe\u0301s", "CAFÉ",
        "the cat sat on the mat", "🇫🇷 drapeau", "", "\u0300\u0301\u0302\u0303\u0304", "a\u0300\u0301 b\u0302\u0303",
    ]
    marks = POOLS["marks"] + ["\u0300", "\u0302", "\u0327", "\u0331"]
    for _ in range(20):
        fixed.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz ,.'\n1") +
                             "".join(rng.choice(marks) for _ in range(rng.randint(0, 2)))
                             for _ in range(rng.randint(1, 12))))
    return fixed


def train_mini_bpe(corpus, merges_wanted):
    """Plain BPE training on byte-level words: the most frequent adjacent pair, ties by order."""
    byte_chars = bytes_to_unicode()
    words = Counter()
    for text in corpus:
        for piece in regex.findall(QWEN35_PATTERN, unicodedata.normalize("NFC", text)):
            words["".join(byte_chars[b] for b in piece.encode("utf-8"))] += 1
    vocab = {byte_chars[b]: i for i, b in enumerate(sorted(byte_chars, key=lambda b: ord(byte_chars[b])))}
    splits = {w: list(w) for w in words}
    merges = []
    while len(merges) < merges_wanted:
        pairs = Counter()
        for w, count in words.items():
            symbols = splits[w]
            for a, b in zip(symbols, symbols[1:]):
                pairs[(a, b)] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], -len(kv[0][0] + kv[0][1]), kv[0]))[0]
        merges.append(best)
        vocab.setdefault(best[0] + best[1], len(vocab))
        for w in words:
            s, merged, i = splits[w], [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    merged.append(s[i] + s[i + 1])
                    i += 2
                else:
                    merged.append(s[i])
                    i += 1
            splits[w] = merged
    return vocab, merges


def bytes_to_unicode():
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, n = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return table


def write_jsonl(path, strings):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for s in strings:
            f.write(json.dumps(s, ensure_ascii=False) + "\n")


def main():
    rng = random.Random(20261129)
    strings = HAND + NEWER_UNICODE + generated(rng)
    write_jsonl(DATA / "strings.jsonl", strings)

    corpus = HAND + mini_strings(random.Random(7)) * 3 + ["the cat sat on the mat"] * 20
    vocab, merges = train_mini_bpe(corpus, 400)
    added = []
    for content, special, extra in [("<|endoftext|>", True, {}), ("<|im_start|>", True, {}),
                                    ("<|im_end|>", True, {}), ("<think>", False, {}), ("</think>", False, {}),
                                    ("<mask>", True, {"lstrip": True, "rstrip": True}),
                                    ("café", False, {"normalized": True})]:
        token = {"id": len(vocab) + len(added), "content": content, "single_word": False, "lstrip": False,
                 "rstrip": False, "normalized": False, "special": special}
        token.update(extra)
        added.append(token)
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN35_PATTERN}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    mini = DATA / "qwen35_mini"
    mini.mkdir(parents=True, exist_ok=True)
    (mini / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "clean_up_tokenization_spaces": False, "model_max_length": 4096,
              "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}
    (mini / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    write_jsonl(mini / "strings.jsonl", mini_strings(random.Random(11)))
    print(f"{len(strings)} strings; mini tokenizer: {len(vocab)} vocab, {len(merges)} merges")


if __name__ == "__main__":
    main()
