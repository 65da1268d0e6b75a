"""A corpus of texts where tokenizers disagree when their pre-tokenizers differ: apostrophes and contractions,
digits and long numbers, code and JSON, emoji, other scripts, runs of whitespace, chat special tokens, and
random mixtures of them. Deterministic: the same ``seed`` gives the same texts."""
from __future__ import annotations

import random

WORDS = ["user's", "don't", "it'll", "I've", "we'd", "they're", "you'RE", "O'Brien", "rock'n'roll", "'quoted'",
         "can't", "shan't", "ma'am", "y'all", "it's", "He'S", "WE'LL", "'tis", "ol'", "Jones'"]
NUMBERS = ["3", "33", "333", "3333", "1234567890", "3.14159", "2,147,483,647", "1e-9", "0x1F", "-42", "+7",
           "2026-11-27", "12:45:00", "v1.2.3", "$19.99", "100%", "1/3", "٣٤٥", "१२३", "１２３"]
CODE = ['{"k": "v"}', '{"a": [1, 2, {"b": null}]}', "def f(x):\n    return x ** 2", "for (int i = 0; i < n; ++i) {}",
        "SELECT * FROM t WHERE id = 1;", "<div class=\"a\">b</div>", "x = y if z else w  # note",
        "console.log(`${a}`);", "fn main() -> i32 { 0 }", "a && b || !c", "path/to/file.py:12", "k=v&x=1"]
EMOJI = ["🚀", "😶‍🌫️", "👍🏽", "🦙🦙", "✅", "🇫🇷", "👨‍👩‍👧‍👦", "❤️", "😁😁😁", "🤖"]
SCRIPTS = ["Привет, мир", "нещо на Български", "我想在apple工作", "こんにちは世界", "안녕하세요", "مرحبا بالعالم",
           "שלום עולם", "नमस्ते दुनिया", "กรุงเทพมหานคร", "កាន់តែពិសេស", "Ελληνικά", "Tiếng Việt có dấu",
           "Zürich straße", "naïve café", "ǅemal"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", " \n ", "\r\n", "\u00a0", "\u3000", "    \n    "]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
PUNCT = ["...", "!!!", "?!", "------", "=======", "```", '""""', "''''", "(", ")", ",", ";", "—", "…"]
KINDS = [WORDS, NUMBERS, CODE, EMOJI, SCRIPTS, PUNCT]


def corpus(n: int = 1200, seed: int = 0) -> list[str]:
    """``n`` texts: every fragment alone (bare and after a space), then random mixtures joined by whitespace runs."""
    rng = random.Random(seed)
    texts = []
    for kind in KINDS + [SPACES, SPECIAL]:
        for frag in kind:
            texts += [frag, " " + frag]
    while len(texts) < n:
        parts = []
        for _ in range(rng.randint(2, 8)):
            kind = rng.choice(KINDS + [SPECIAL] * (rng.random() < 0.1))
            parts.append(rng.choice(kind))
            parts.append(rng.choice(SPACES) if rng.random() < 0.4 else rng.choice(["", " "]))
        texts.append("".join(parts))
    return texts[:max(n, len(texts))]
