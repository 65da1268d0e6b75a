"""A shipped pool of prompts x sampled replies, and planted preferences to benchmark reward models on.

The question the pool answers: does a reward model learn what annotators prefer from 16-256 votes?
Replies come from the app's default model (SmolLM2-135M-Instruct) under varied style hints, so style
preferences are learnable; each planted preference is a pure text scorer, and pairs are labelled by it.

    python -m rlhf.bench.preference_pool generate   # writes assets/preference_pool.jsonl.gz (CPU: 18 min at 1 thread)
    python -m rlhf.bench.preference_pool stats      # usable pairs and length-only baselines per preference
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
POOL_PATH = ROOT / "assets" / "preference_pool.jsonl.gz"

# ---------------------------------------------------------------------------------------------- prompts
# family -> (templates, fillers). A filler is a string, or a tuple for templates with several slots.
FAMILIES: dict[str, tuple[tuple[str, ...], tuple]] = {
    "howto": (("How do I {}?", "What is the best way to {}?", "Can you tell me how to {}?"), (
        "start a vegetable garden", "change a flat bicycle tire", "learn to touch type", "clean a cast iron pan",
        "write a cover letter", "prepare for a job interview", "back up the photos on my phone",
        "remove a coffee stain from a shirt", "train a puppy to sit", "make a budget spreadsheet",
        "improve my handwriting", "fall asleep faster", "start running as a beginner", "memorize a short speech",
        "keep houseplants alive", "unclog a kitchen sink", "set up a home Wi-Fi network",
        "learn a new language on my own", "organize a small closet", "reduce my screen time", "paint a room",
        "write a short poem", "negotiate a higher salary", "take better photos with my phone",
        "make cold brew coffee", "stop procrastinating", "choose a good password", "teach a child to ride a bike",
        "sharpen a kitchen knife", "pack a suitcase efficiently", "get rid of fruit flies", "start journaling")),
    "explain": (("Explain how {} works.", "How does {} work?", "Can you explain {} in simple terms?"), (
        "a refrigerator", "a rainbow", "the immune system", "compound interest", "a vaccine",
        "an electric car battery", "the internet", "photosynthesis", "a solar panel", "inflation",
        "a microwave oven", "GPS", "a credit score", "the water cycle", "an airplane wing", "a search engine",
        "a heat pump", "the stock market", "a black hole", "recycling", "a password manager", "DNA",
        "a thermostat", "a touchscreen", "noise-cancelling headphones", "a nuclear power plant",
        "a 3D printer", "the tides", "muscle growth", "a camera lens", "blockchain", "an earthquake")),
    "why": (("Why {}?", "Can you explain why {}?", "I've always wondered: why {}?"), (
        "is the sky blue", "do leaves change color in autumn", "do we dream", "is sleep important",
        "do cats purr", "does bread go stale", "do onions make people cry", "is the ocean salty",
        "do we get goosebumps", "does ice float on water", "do airplanes leave white trails", "do we yawn",
        "is exercise good for the brain", "does metal feel colder than wood", "do stars twinkle",
        "do people get jet lag", "do bubbles form in boiling water", "does coffee keep people awake",
        "do birds migrate", "do we have fingerprints", "does the moon change shape", "do cats land on their feet",
        "do we need vitamins", "does popcorn pop", "do knuckles crack")),
    "advice": (("I want to {}. What advice would you give me?", "Any advice for someone who wants to {}?",
                "What should I keep in mind if I want to {}?"), (
        "switch careers into programming", "move to a new city", "run my first marathon", "adopt a cat",
        "buy my first car", "save for a house", "make new friends as an adult", "get better at public speaking",
        "start a small online shop", "eat more vegetables", "become a morning person", "learn to play the guitar",
        "go back to university", "travel alone for the first time", "work from home productively",
        "ask my boss for feedback", "start investing with little money", "deal with stress at work",
        "keep a long-distance friendship", "read more books", "get into cycling", "start a podcast",
        "volunteer in my community", "prepare for a long hike", "learn to cook", "quit drinking soda",
        "write a novel", "improve my posture", "teach myself to draw", "grow my own herbs")),
    "fact": (("{}",), (
        "What is the capital of Canada?", "How many continents are there?",
        "What is the boiling point of water in Fahrenheit?", "Who painted the Mona Lisa?",
        "How many bones are in the adult human body?", "What is the largest planet in the solar system?",
        "What language is spoken in Brazil?", "How long does light from the Sun take to reach Earth?",
        "What is the chemical symbol for gold?", "How many days are in a leap year?",
        "Who wrote Romeo and Juliet?", "What is the tallest mountain in the world?",
        "How many legs does a spider have?", "What is the freezing point of water in Celsius?",
        "Which planet is known as the Red Planet?", "What is the largest ocean on Earth?",
        "How many minutes are in a day?", "What gas do plants absorb from the air?",
        "Who was the first person to walk on the Moon?", "What is the square root of 144?",
        "How many players does a soccer team have on the field?", "What is the longest river in Africa?",
        "In which year did World War II end?", "What is the main ingredient in guacamole?",
        "How many strings does a standard guitar have?", "What is the smallest prime number?",
        "What currency is used in Japan?", "How many hearts does an octopus have?",
        "What is the hardest natural substance?", "Roughly how fast does sound travel in air?",
        "Which organ pumps blood through the body?", "How many sides does a hexagon have?",
        "What is the capital of Kenya?", "Who developed the theory of relativity?",
        "What is the most spoken language in the world?", "How many teaspoons are in a tablespoon?",
        "What is the largest desert in the world?", "How many hours of sleep do adults need?",
        "What does a thermometer measure?", "How far is the Moon from Earth?")),
    "compare": (("What is the difference between {} and {}?", "Compare {} and {}.",
                 "Which is better, {} or {}, and why?"), (
        ("a virus", "a bacterium"), ("weather", "climate"), ("tea", "coffee"), ("renting", "buying a home"),
        ("cats", "dogs as pets"), ("running", "swimming for fitness"), ("a laptop", "a desktop computer"),
        ("baking soda", "baking powder"), ("stocks", "bonds"), ("e-books", "paper books"),
        ("electric cars", "petrol cars"), ("a crocodile", "an alligator"), ("RAM", "disk storage"),
        ("a debit card", "a credit card"), ("butter", "margarine"), ("yoga", "pilates"),
        ("a city break", "a beach holiday"), ("Python", "JavaScript"), ("a hurricane", "a tornado"),
        ("LED bulbs", "incandescent bulbs"), ("a nap", "a full night's sleep"), ("white rice", "brown rice"),
        ("trains", "planes for a 500 km trip"), ("a frog", "a toad"), ("freelancing", "a full-time job"),
        ("a fixed-rate mortgage", "a variable-rate mortgage"), ("a lake", "a pond"), ("a violin", "a viola"),
        ("studying in the morning", "studying at night"), ("walking", "cycling to work"))),
    "recipe": (("Give me a simple recipe for {}.", "How do I cook {}?", "What do I need to make {}?"), (
        "pancakes", "tomato soup", "guacamole", "banana bread", "a vegetable stir-fry", "scrambled eggs",
        "chocolate chip cookies", "a Greek salad", "lentil curry", "homemade pizza", "chicken noodle soup",
        "hummus", "overnight oats", "a fruit smoothie", "spaghetti carbonara", "roasted vegetables",
        "French toast", "mashed potatoes", "a tuna sandwich", "fried rice", "lemonade", "apple crumble",
        "bean chili", "garlic bread", "a simple omelette", "pesto pasta", "rice pudding", "grilled cheese")),
    "plan": (("Help me plan {}.", "Can you make a plan for {}?", "How should I organize {}?"), (
        "a birthday party for a ten-year-old", "a weekend trip to the mountains", "a week of healthy meals",
        "my study schedule for final exams", "a small wedding", "a move to a new apartment",
        "a garden for next spring", "a road trip across the country", "a team-building day at work",
        "a 30-day fitness challenge", "a picnic in the park", "a budget for a family of four",
        "a reading list for the summer", "a garage sale", "a day in Paris", "a board game night",
        "a camping trip with kids", "a surprise anniversary dinner", "a home office setup",
        "my first 5K race training", "a bake sale for charity", "a weekly cleaning routine",
        "a language exchange meetup", "a vacation on a tight budget", "a holiday dinner for twelve people",
        "a morning routine", "a book club", "a school science fair project")),
    "tips": (("What are some tips for {}?", "Give me tips for {}.", "How can I get better at {}?"), (
        "saving money on groceries", "staying focused while studying", "writing clear emails",
        "keeping a tidy kitchen", "sleeping on a plane", "running in hot weather", "making small talk",
        "taking notes in class", "driving in snow", "remembering names", "managing my time",
        "cooking rice perfectly", "reducing food waste", "giving a good presentation", "staying hydrated",
        "working in a noisy office", "learning math", "traveling with a toddler", "decluttering my home",
        "staying safe online", "choosing a good book", "writing a resume", "meditating", "waking up early",
        "keeping a conversation going")),
    "define": (("What is {}?", "What does the term '{}' mean?", "Define {} in plain words."), (
        "machine learning", "a recession", "mindfulness", "a carbon footprint", "an allergy", "a haiku",
        "a metaphor", "cloud computing", "a calorie", "democracy", "an index fund", "a placebo", "gravity",
        "a sonnet", "biodiversity", "a firewall", "a budget deficit", "entropy", "a food desert", "an API",
        "osmosis", "a supernova", "a podcast", "a mutual fund", "an ecosystem")),
    "proscons": (("What are the pros and cons of {}?", "Thinking about {}: what are the upsides and downsides?"), (
        "working from home", "living in a big city", "owning a car", "solar panels on a house",
        "online classes", "a vegetarian diet", "having a pet", "social media", "a four-day work week",
        "buying used clothes", "electric scooters", "homeschooling", "a gap year", "smart speakers",
        "public transport", "credit cards", "open-plan offices", "learning two languages at once",
        "intermittent fasting", "self-driving cars")),
    "write": (("Write a short thank-you note to {}.", "Help me write a short message to thank {}."), (
        "a teacher", "a neighbour who helped me move", "a friend who sent a gift", "my team at work",
        "a nurse", "my grandmother", "a host after a dinner party", "a coach", "a mentor",
        "a colleague who covered my shift", "a librarian", "a landlord who fixed the heating")),
}


def _fill(template: str, filler) -> str:
    """One prompt from a template and its filler."""
    return template.format(*filler) if isinstance(filler, tuple) else template.format(filler)


def build_prompts(n: int = 320, seed: int = 0) -> list[str]:
    """``n`` distinct prompts: every filler once (random template) before any filler is reused."""
    rng = random.Random(seed)
    passes: list[list[str]] = []
    for templates, fillers in FAMILIES.values():
        for filler in fillers:
            order = list(templates)
            rng.shuffle(order)
            for depth, template in enumerate(order):
                while len(passes) <= depth:
                    passes.append([])
                passes[depth].append(_fill(template, filler))
    prompts: list[str] = []
    for bucket in passes:
        rng.shuffle(bucket)
        prompts.extend(p for p in bucket if p not in prompts)
    if n > len(prompts):
        raise ValueError(f"only {len(prompts)} distinct prompts can be built, asked for {n}")
    return prompts[:n]


# -------------------------------------------------------------------------------------------- generation
# Style hints, appended to the user turn (SmolLM2-135M all but ignores them as a system prompt: measured).
# Each reply draws each style axis on its own, so within one prompt most axes vary and every planted
# preference finds pairs. A reply's hints are stored as a bitmask over HINTS; the stored prompt has none.
HINTS: tuple[str, ...] = (
    "Answer in one or two sentences.",
    "Explain in detail.",
    "Use a bulleted list.",
    "Be warm and friendly.",
    "Give concrete numbers and steps.",
    "Start with the answer.",
)
AXES: tuple[tuple[tuple[Optional[int], ...], tuple[float, ...]], ...] = (  # (hint choices, weights) per axis
    ((None, 0, 1), (0.5, 0.3, 0.2)),  # length
    ((None, 2), (0.65, 0.35)),  # format
    ((None, 3), (0.6, 0.4)),  # tone
    ((None, 4), (0.6, 0.4)),  # concreteness
    ((None, 5), (0.7, 0.3)),  # directness
)
SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
DANGLING = re.compile(r"(?:\n[ \t]*(?:\d{1,2}[.)]|[-*•+#]+|\**)?[ \t]*)+$")  # empty trailing list items/markup


def assign_hints(n_prompts: int, k: int, seed: int) -> list[list[int]]:
    """For each prompt, ``k`` hint bitmasks, one style choice per axis drawn independently."""
    rng = random.Random(seed + 1)
    return [[sum(1 << h for choices, weights in AXES for h in rng.choices(choices, weights) if h is not None)
             for _ in range(k)] for _ in range(n_prompts)]


def hint_text(mask: int) -> str:
    """The style hints of a bitmask, as one string."""
    return " ".join(h for i, h in enumerate(HINTS) if mask >> i & 1)


def trim_cut(text: str, keep: float = 0.4) -> str:
    """A reply cut by the token limit, trimmed back to its last sentence end if that keeps enough of it."""
    ends = [m.end() for m in SENTENCE_END.finditer(text)]
    if ends and ends[-1] >= keep * len(text):
        return text[:ends[-1]].strip()
    return text.strip()


def strip_dangling(text: str) -> str:
    """The text without trailing empty list items ("4.") or markup lines (kept whole if nothing else is left)."""
    return DANGLING.sub("", "\n" + text).strip() or text


def tidy(text: str, finished: bool) -> str:
    """A generated reply: trimmed back to a sentence end when cut by the token limit, dangling items dropped."""
    return strip_dangling(text.strip() if finished else trim_cut(text))


def degenerate(text: str) -> bool:
    """A reply that is not text: under 3 words, mostly symbols/emoji (< 50% letters), or a 10-character run."""
    chars = [c for c in text if not c.isspace()]
    letters = sum(c.isalpha() for c in chars) / max(1, len(chars))
    return len(words(text)) < 3 or letters < 0.5 or re.search(r"(.)\1{9,}", text) is not None


def _messages(prompt: str, mask: int) -> list[dict]:
    """The chat sent to the model for one reply: the prompt, then its style hints."""
    return [{"role": "user", "content": f"{prompt} {hint_text(mask)}".strip()}]


def sample_batch(model, tok, chats: list[list[dict]], seed: int, args) -> list[str]:
    """Sampled replies for a batch of chats (left padded), trimmed when cut by max_new_tokens."""
    import torch

    enc = tok.apply_chat_template(chats, add_generation_prompt=True, padding=True, return_tensors="pt",
                                  return_dict=True)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=True, temperature=args.temperature, top_p=args.top_p,
                             max_new_tokens=args.max_new_tokens, pad_token_id=tok.pad_token_id)
    gen = out[:, enc["input_ids"].shape[1]:]
    finished = (gen == tok.eos_token_id).any(dim=1).tolist()
    texts = tok.batch_decode(gen, skip_special_tokens=True)
    return [tidy(t, done) for t, done in zip(texts, finished)]


def generate(args) -> None:
    """Sample the pool from the default model and write it as gzip JSON lines."""
    import torch
    from tqdm import tqdm

    from rlhf.config import AppConfig
    from rlhf.models import load_causal_lm, load_tokenizer, resolve_model

    torch.set_num_threads(args.threads)
    model_name = args.model or AppConfig().base_model
    source = resolve_model(model_name, args.data_dir or AppConfig().data_path, allow_hub=False)
    tok, model = load_tokenizer(source), load_causal_lm(source, "cpu")
    prompts = build_prompts(args.prompts, args.seed)
    hints = assign_hints(len(prompts), args.replies, args.seed)
    # Rows grouped by hints so short-style batches stop early; the order is fixed, so seeds are too.
    rows = sorted(((h, i, s) for i, hs in enumerate(hints) for s, h in enumerate(hs)))
    replies = [[""] * args.replies for _ in prompts]
    start = time.time()
    with tqdm(total=len(rows), desc="replies", unit="reply") as bar:
        for b in range(0, len(rows), args.batch_size):
            batch = rows[b:b + args.batch_size]
            texts = sample_batch(model, tok, [_messages(prompts[i], h) for h, i, _ in batch],
                                 args.seed * 100_000 + b, args)
            for (_, i, s), text in zip(batch, texts):
                replies[i][s] = text
            bar.update(len(batch))
    resampled = resample_degenerate(model, tok, prompts, hints, replies, args)
    meta = {"model": model_name, "source": Path(source).name, "seed": args.seed, "temperature": args.temperature,
            "top_p": args.top_p, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
            "threads": args.threads, "hints": list(HINTS), "seconds": round(time.time() - start, 1),
            "hint_encoding": "bitmask over hints, appended to the user turn", "resampled": resampled,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m rlhf.bench.preference_pool " + " ".join(sys.argv[1:])}
    records = [{"prompt_id": f"p{i:04d}", "prompt": p, "replies": replies[i], "hints": hints[i]}
               for i, p in enumerate(prompts)]
    write_pool(Path(args.out), meta, records)
    print(f"wrote {len(records)} prompts x {args.replies} replies to {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.2f} MB) in {meta['seconds']:.0f} s")


def resample_degenerate(model, tok, prompts: list[str], hints: list[list[int]], replies: list[list[str]], args,
                        attempts: int = 3) -> int:
    """Resample degenerate replies in place (new seeds, up to ``attempts`` rounds); how many were resampled."""
    total = 0
    for attempt in range(1, attempts + 1):
        rows = [(hints[i][s], i, s) for i in range(len(prompts)) for s in range(len(replies[i]))
                if degenerate(replies[i][s])]
        total += len(rows)
        for b in range(0, len(rows), args.batch_size):
            batch = rows[b:b + args.batch_size]
            texts = sample_batch(model, tok, [_messages(prompts[i], h) for h, i, _ in batch],
                                 args.seed * 100_000 + 90_000 + attempt * 1_000 + b, args)
            for (_, i, s), text in zip(batch, texts):
                replies[i][s] = text
    return total


def write_pool(path: Path, meta: dict, records: Sequence[dict]) -> None:
    """Gzip JSON lines: a meta header, then one line per prompt (temp file + atomic rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def read_meta(path: Optional[Path] = None) -> dict:
    """The header line of the pool file."""
    with gzip.open(path or POOL_PATH, "rt", encoding="utf-8") as f:
        return json.loads(f.readline())["meta"]


def load_pool(path: Optional[str | Path] = None) -> list[dict]:
    """The pool's prompt records (the meta line skipped)."""
    with gzip.open(Path(path) if path else POOL_PATH, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "meta" not in r]


# ------------------------------------------------------------------------------------------ preferences
WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'’.,%-]*")
LIST_LINE = re.compile(r"^\s*(?:[-*•+]|\d{1,2}[.)]|[a-h][.)]|#+)\s+\S")
NUMBER = re.compile(r"\d")
LIST_MARKER = re.compile(r"^\s*(?:\d{1,2}[.)]|[-*•+])\s+", re.MULTILINE)
NUMBER_WORDS = frozenset("one two three four five six seven eight nine ten eleven twelve fifteen twenty thirty "
                         "hundred thousand million billion dozen half quarter".split())
UNITS = frozenset("second seconds minute minutes min hour hours hrs day days week weeks month months year years "
                  "cup cups tbsp tsp tablespoon tablespoons teaspoon teaspoons gram grams g kg kilogram kilograms "
                  "ounce ounces oz pound pounds lb lbs ml liter liters litre litres cm mm meter meters metre metres "
                  "km kilometers kilometres mile miles inch inches feet foot degrees °c °f % percent $ dollars "
                  "calories times".split())
STEP_OPENERS = ("first", "second", "third", "then", "next", "finally", "step", "after that", "lastly")
FILLER_OPENER = re.compile(  # openers that delay the answer: pleasantries, preambles, self-reference
    r"^(?:sure|certainly|of course|absolutely|great|good question|what a|wow|i|as an ai|as a language|well,|"
    r"hello|hi|hey|oh|ah|thanks?|thank you|okay|ok|let me|let's|let us|so|ready|welcome|to answer|in this|"
    r"when it comes|there (?:are|is) (?:many|several|a few|some|various|no)|it'?s (?:important|essential)|"
    r"it is (?:important|essential)|it depends|that'?s a|that is a|this is a|here'?s|here is|here are|you asked)\b")
WARM = re.compile(  # friendly, polite wording (what "Be warm and friendly." adds to this model's replies)
    r"\b(?:happy|glad|delighted|pleased|welcome|enjoy\w*|fun|love|lovely|wonderful|amazing|fantastic|awesome|"
    r"exciting|excited|hope|hopefully|please|thanks?|appreciate\w*|friend\w*|dear|kind|kindly|cheers|"
    r"good luck|best wishes|take care|feel free|don't worry|no worries|you've got this|congratulations|"
    r"hello|hi|hey|smile\w*|joy\w*|here to help)\b", re.IGNORECASE)
EMOJI = re.compile("[\U0001F300-\U0001FAFF\u2600-\u27BF]")


def words(text: str) -> list[str]:
    """The reply's words (numbers and contractions count as one word)."""
    return WORD.findall(text)


def first_sentence(text: str) -> str:
    """Text up to the first sentence end, colon or line break."""
    m = re.search(r"[.!?:](?=\s|$)|\n", text.strip())
    return text.strip()[: m.end() if m else None].strip()


def score_shorter(prompt: str, reply: str) -> float:
    """Surface: fewer words is better (log scale, so 10 vs 20 words counts like 50 vs 100)."""
    return -math.log1p(len(words(reply)))


def score_no_lists(prompt: str, reply: str) -> float:
    """Surface: prose beats lists; minus the share of non-empty lines that are bullet/numbered items."""
    lines = [ln for ln in reply.splitlines() if ln.strip()]
    return -sum(bool(LIST_LINE.match(ln)) for ln in lines) / max(1, len(lines))


def concrete_hits(reply: str) -> int:
    """Quantities (numbers, number words, units) plus explicit step markers, at most 3 of the latter."""
    body = LIST_MARKER.sub("", reply)  # list numbering is a step marker, not a quantity
    quantities = sum(bool(NUMBER.search(w)) or w.lower().strip(".,") in NUMBER_WORDS | UNITS for w in words(body))
    numbered = len(re.findall(r"^\s*\d{1,2}[.)]\s", reply, re.MULTILINE))
    openers = sum(seg.strip(" *").lower().startswith(STEP_OPENERS) for seg in re.split(r"(?<=[.!?])\s+|\n", reply))
    return quantities + sum(reply.count(c) for c in "%$°") + min(3, numbered + openers)


def score_concrete(prompt: str, reply: str) -> float:
    """Content: concrete numbers, quantities and steps, per square root of length (not just longer)."""
    return concrete_hits(reply) / math.sqrt(max(8, len(words(reply))))


def score_direct(prompt: str, reply: str) -> float:
    """Content: the first sentence answers: no filler opener, no preamble/question, not long, not an echo."""
    first = first_sentence(reply)
    low = first.lower().replace("’", "'")
    q = {w.lower().strip(".,'’") for w in words(prompt) if len(w) > 3}
    fw = [w.lower().strip(".,'’") for w in words(first) if len(w) > 3]
    echo = bool(fw) and sum(w in q for w in fw) / len(fw) >= 0.75 and len(fw) >= 3
    return -(bool(FILLER_OPENER.match(low)) + first.endswith((":", "?")) + echo + 0.5 * (len(words(first)) > 30)
             + (not first))


def warm_hits(reply: str) -> int:
    """Warm words and phrases, exclamation marks and emoji (at most 3 each) in a reply."""
    return len(WARM.findall(reply)) + min(3, reply.count("!")) + min(3, len(EMOJI.findall(reply)))


def score_warm(prompt: str, reply: str) -> float:
    """Tone: warm, polite wording per square root of length, plus a small share of 'you'."""
    ws = [w.lower() for w in words(reply)]
    you = sum(w in ("you", "your", "you're", "you'll", "yourself") for w in ws) / max(1, len(ws))
    return warm_hits(reply) / math.sqrt(max(8, len(ws))) + you


@dataclass(frozen=True)
class Preference:
    """A planted preference: a text scorer, the score gap below which two replies tie, a label flip rate."""
    name: str
    kind: str
    score: Callable[[str, str], float]
    margin: float
    flip: float = 0.0
    balance_length: bool = True  # pick pairs so that length alone cannot predict the label


PREFERENCES: dict[str, Preference] = {p.name: p for p in (
    Preference("shorter", "surface", score_shorter, margin=0.1, balance_length=False),  # >= ~10% fewer words
    Preference("no_lists", "surface", score_no_lists, margin=0.1),
    Preference("concrete", "content", score_concrete, margin=0.25),
    Preference("direct", "content", score_direct, margin=0.5),
    Preference("warm", "tone", score_warm, margin=0.1),
    Preference("concrete_noisy", "content+noise", score_concrete, margin=0.25, flip=0.15),
)}


# ----------------------------------------------------------------------------------------------- pairs
HELDOUT_PROMPTS = 160  # of 320; at most 2 pairs each gives 200 held-out pairs per preference (152 is the least)
HELDOUT_PAIRS = 200
HELDOUT_SEED = 12345


def _word_count(text: str) -> int:
    """Words in a reply (for length checks)."""
    return len(words(text))


def usable_pairs(record: dict, pref: Preference) -> list[tuple[int, int]]:
    """Reply index pairs (better, worse) whose scores differ by more than the preference's margin."""
    s = [pref.score(record["prompt"], r) for r in record["replies"]]
    out = []
    for i, j in itertools.combinations(range(len(s)), 2):
        if abs(s[i] - s[j]) > pref.margin:
            out.append((i, j) if s[i] > s[j] else (j, i))
    return out


def _flipped(pref: Preference, seed: int, pid: str, a: int, b: int) -> bool:
    """Whether this pair's label is flipped: a fixed coin per (seed, prompt, reply pair)."""
    return pref.flip > 0 and random.Random(f"{seed}|{pid}|{min(a, b)}|{max(a, b)}").random() < pref.flip


def _pick(cands: list[tuple[int, int]], replies: list[str], want_shorter: Optional[bool]) -> tuple[int, int]:
    """The first candidate whose chosen reply is shorter (or not) as wanted, else the first one."""
    for a, b in cands:
        if want_shorter is None or (_word_count(replies[a]) < _word_count(replies[b])) == want_shorter:
            return a, b
    return cands[0]


def make_pairs(pool: Sequence[dict], preference: str, prompt_ids: Sequence[str], seed: int,
               n: Optional[int] = None, max_per_prompt: Optional[int] = None,
               balance: Optional[bool] = None) -> list[dict]:
    """Labelled pairs ``{prompt_id, prompt, chosen, rejected}``, deterministic given (seed, prompt ids).

    Rounds over the prompts in a seeded order take one new reply pair per prompt each, until ``n``
    pairs (``None``: one round) or ``max_per_prompt`` rounds. Ties (score gap <= margin) are skipped.
    With length balancing the pick alternates between pairs whose chosen reply is shorter and longer,
    so length alone cannot predict the label. Noisy preferences flip a fixed share of labels.
    """
    pref = PREFERENCES[preference]
    balance = pref.balance_length if balance is None else balance
    by_id = {r["prompt_id"]: r for r in pool}
    rng = random.Random(seed)
    ids = sorted(set(prompt_ids))
    cands = {pid: usable_pairs(by_id[pid], pref) for pid in ids}
    for pid in ids:
        rng.shuffle(cands[pid])
    rounds = max_per_prompt or (1 if n is None else max(map(len, cands.values()), default=0))
    pairs: list[dict] = []
    shorter = 0
    for _ in range(rounds):
        order = [pid for pid in ids if cands[pid]]
        rng.shuffle(order)
        for pid in order:
            if n is not None and len(pairs) >= n:
                return pairs
            replies = by_id[pid]["replies"]
            a, b = _pick(cands[pid], replies, (2 * shorter <= len(pairs)) if balance else None)
            cands[pid].remove((a, b))
            shorter += _word_count(replies[a]) < _word_count(replies[b])
            if _flipped(pref, seed, pid, a, b):
                a, b = b, a
            pairs.append({"prompt_id": pid, "prompt": by_id[pid]["prompt"], "chosen": replies[a],
                          "rejected": replies[b]})
    return pairs


def split_prompts(pool: Sequence[dict], n_heldout: int = HELDOUT_PROMPTS, seed: int = 0) -> tuple[list, list]:
    """A fixed split of prompt ids into (train, held-out), disjoint."""
    ids = sorted(r["prompt_id"] for r in pool)
    random.Random(seed).shuffle(ids)
    return sorted(ids[n_heldout:]), sorted(ids[:n_heldout])


def heldout_pairs(pool: Sequence[dict], preference: str, n: int = HELDOUT_PAIRS) -> list[dict]:
    """The fixed held-out pairs of a preference (at most 2 per held-out prompt)."""
    _, heldout = split_prompts(pool)
    return make_pairs(pool, preference, heldout, seed=HELDOUT_SEED, n=n, max_per_prompt=2)


# ------------------------------------------------------------------------------------------------ stats
def length_feature(pair: dict) -> float:
    """Difference of log word counts, chosen minus rejected."""
    return math.log1p(_word_count(pair["chosen"])) - math.log1p(_word_count(pair["rejected"]))


def fit_length_model(pairs: Sequence[dict], l2: float = 1e-3, steps: int = 50) -> float:
    """Weight w of P(chosen) = sigmoid(w * dlogwords), by Newton's method on the pairwise log-likelihood."""
    xs = [length_feature(p) for p in pairs]
    w = 0.0
    for _ in range(steps):
        sig = [1 / (1 + math.exp(-w * x)) for x in xs]
        grad = sum((1 - s) * x for s, x in zip(sig, xs)) - l2 * w
        hess = -sum(s * (1 - s) * x * x for s, x in zip(sig, xs)) - l2
        w -= grad / hess
    return w


def length_accuracy(w: float, pairs: Sequence[dict]) -> float:
    """Share of pairs the length-only model gets right (a zero margin counts half)."""
    margins = [w * length_feature(p) for p in pairs]
    return sum(1.0 if m > 0 else 0.5 if m == 0 else 0.0 for m in margins) / max(1, len(margins))


def chosen_shorter(pairs: Sequence[dict]) -> float:
    """Share of pairs whose chosen reply has fewer words."""
    return sum(_word_count(p["chosen"]) < _word_count(p["rejected"]) for p in pairs) / max(1, len(pairs))


def preference_stats(pool: Sequence[dict], preference: str, balance: Optional[bool] = None) -> dict:
    """Usable pairs in train/held-out, chosen-is-shorter share and length-only accuracy on held-out."""
    pref = PREFERENCES[preference]
    train, held = split_prompts(pool)
    by_id = {r["prompt_id"]: r for r in pool}
    test = make_pairs(pool, preference, held, seed=HELDOUT_SEED, n=HELDOUT_PAIRS, max_per_prompt=2, balance=balance)
    fit = make_pairs(pool, preference, train, seed=0, n=256, balance=balance)
    return {"preference": preference, "kind": pref.kind,
            "usable_train": sum(len(usable_pairs(by_id[i], pref)) for i in train),
            "usable_heldout": sum(len(usable_pairs(by_id[i], pref)) for i in held),
            "train_pairs": len(fit), "heldout_pairs": len(test), "chosen_shorter": chosen_shorter(test),
            "length_acc": length_accuracy(fit_length_model(fit), test)}


def print_stats(pool: Sequence[dict]) -> None:
    """A table of preference_stats, with and without length-balanced pair picking."""
    train, held = split_prompts(pool)
    print(f"pool: {len(pool)} prompts x {len(pool[0]['replies'])} replies; split {len(train)} train / "
          f"{len(held)} held-out prompts; held-out pairs: at most 2 per prompt, seed {HELDOUT_SEED}")
    head = ("preference", "kind", "usable tr", "usable ho", "pairs tr", "pairs ho", "shorter", "len-acc",
            "raw shorter", "raw len-acc")
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name in PREFERENCES:
        s, raw = preference_stats(pool, name), preference_stats(pool, name, balance=False)
        print(f"| {name} | {s['kind']} | {s['usable_train']} | {s['usable_heldout']} | {s['train_pairs']} | "
              f"{s['heldout_pairs']} | {s['chosen_shorter']:.2f} | {s['length_acc']:.2f} | "
              f"{raw['chosen_shorter']:.2f} | {raw['length_acc']:.2f} |")
    print_hint_means(pool)


def print_hint_means(pool: Sequence[dict]) -> None:
    """Mean score of replies with minus without each style hint, per preference (how learnable each one is)."""
    names = [n for n, p in PREFERENCES.items() if not p.flip]
    print("\nmean score with minus without each style hint, and mean words with it")
    rows = [(r["prompt"], rep, m) for r in pool for rep, m in zip(r["replies"], r["hints"])]
    for h, text in enumerate(HINTS):
        on = [(q, a) for q, a, m in rows if m >> h & 1]
        off = [(q, a) for q, a, m in rows if not m >> h & 1]
        if not on or not off:
            continue
        gaps = {n: _mean(PREFERENCES[n].score, on) - _mean(PREFERENCES[n].score, off) for n in names}
        words_on = sum(_word_count(a) for _, a in on) / len(on)
        print(f"  {text[:34]:34s} n={len(on):4d} words {words_on:5.1f} "
              + " ".join(f"{k} {v:+.2f}" for k, v in gaps.items()))


def _mean(score: Callable[[str, str], float], rows: Sequence[tuple[str, str]]) -> float:
    """Mean score over (prompt, reply) rows."""
    return sum(score(q, a) for q, a in rows) / len(rows)


# ------------------------------------------------------------------------------------------------- CLI
def main(argv: Optional[Sequence[str]] = None) -> None:
    """`generate` the pool or print its `stats`."""
    parser = argparse.ArgumentParser(prog="python -m rlhf.bench.preference_pool", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="sample the pool from the default model")
    gen.add_argument("--out", default=str(POOL_PATH))
    gen.add_argument("--prompts", type=int, default=320)
    gen.add_argument("--replies", type=int, default=4)
    gen.add_argument("--batch-size", type=int, default=32)
    gen.add_argument("--max-new-tokens", type=int, default=96)
    gen.add_argument("--temperature", type=float, default=0.9)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--threads", type=int, default=2,
                     help="torch threads; use 1 while other work runs (2 threads collapse ~10x under contention)")
    gen.add_argument("--model", default="", help="default: the app's base_model")
    gen.add_argument("--data-dir", default="", help="where the converted model is cached (default: the app's)")
    st = sub.add_parser("stats", help="usable pairs and length-only baselines per preference")
    st.add_argument("--pool", default=str(POOL_PATH))
    args = parser.parse_args(argv)
    if args.command == "generate":
        generate(args)
    else:
        print_stats(load_pool(args.pool))


if __name__ == "__main__":
    main()
