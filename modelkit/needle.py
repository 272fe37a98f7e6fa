"""Needle-in-a-haystack retrieval probe (``modelkit eval --needle N``).

A *needle* sentence ("The pass key of <name> is <5 digits>.") is placed at a seeded
depth inside a haystack of held-out corpus passages of about ``context`` tokens; the
prompt ends with the question "The pass key of <name> is". The answer is right when
the greedy continuation starts with the digits. Several distractor sentences with
other names and keys are scattered through the haystack, so copying the nearest
number does not pass: the model must retrieve one specific span, exactly what an
eviction method (dropped tokens) or KCache's top-N (V rows not fetched) can lose.

As with the task suite, only the items the baseline answers correctly are kept for
the compared models (``keep``), so the figure measures what a method loses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

NAMES = ("Orion Vale", "Mira Stone", "Tavi Reed", "Ilse Marr", "Cato Finch", "Rhea Holt", "Ezra Quill",
         "Nell Ashby", "Juno Park", "Otto Lind", "Wren Hale", "Pax Moreau", "Ada Kovac", "Lev Tamm")


@dataclass(frozen=True)
class NeedleItem:
    prompt: list[int]
    answer: str
    depth: float


def make_items(corpus: Path, tok, n: int, context: int, seed: int = 0, distractors: int = 3) -> list[NeedleItem]:
    from modelkit.corpus import iter_docs

    rng = random.Random(seed)
    docs = [tok(d["text"], add_special_tokens=False)["input_ids"] for d in iter_docs(corpus, "heldout")]
    rng.shuffle(docs)
    sep = tok("\n\n", add_special_tokens=False)["input_ids"]
    items, di = [], 0
    for i in range(n):
        names = rng.sample(NAMES, distractors + 1)
        keys = [str(rng.randrange(10000, 100000)) for _ in names]
        facts = [tok(f"The pass key of {a} is {k}.", add_special_tokens=False)["input_ids"]
                 for a, k in zip(names, keys)]
        question = tok(f"\n\nThe pass key of {names[0]} is", add_special_tokens=False)["input_ids"]
        budget = context - len(question) - sum(len(f) + 2 * len(sep) for f in facts)
        paragraphs: list[list[int]] = []
        used = 0
        while used < budget:
            doc = docs[di % len(docs)]
            di += 1
            take = doc[:budget - used]
            paragraphs.append(take)
            used += len(take) + len(sep)
        depth = (i + 0.5) / n                          # needle depths spread evenly over the items
        slots = sorted({min(len(paragraphs), round(depth * len(paragraphs)))} |
                       {rng.randrange(len(paragraphs) + 1) for _ in range(distractors)})
        placed: dict[int, list[list[int]]] = {}
        placed.setdefault(min(len(paragraphs), round(depth * len(paragraphs))), []).append(facts[0])
        for f in facts[1:]:                        # distractors: at the needle's slot or random ones
            placed.setdefault(rng.choice(slots), []).append(f)
        ids: list[int] = []
        for p in range(len(paragraphs) + 1):
            for f in placed.get(p, []):
                ids += sep + f + sep
            if p < len(paragraphs):
                ids += paragraphs[p] + sep
        bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
        items.append(NeedleItem(bos + ids + question, keys[0], depth))
    return items


def correct(engine, tok, items: list[NeedleItem]) -> list[bool]:
    """Greedy answers through the engine (its KV methods act): digits first, whitespace ignored."""
    from refengine.sampling_params import SamplingParams

    outs = engine.generate([it.prompt for it in items], SamplingParams(max_tokens=8, temperature=0))
    return [tok.decode(o, skip_special_tokens=True).strip().startswith(it.answer) for o, it in zip(outs, items)]
