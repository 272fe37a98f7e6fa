"""A small task suite with exact answers: arithmetic, copying, sequences, capitals.

Items are generated deterministically (seeded). An item is *kept* only if the
baseline model answers it correctly, so the suite measures what a transformation
loses, not what the small base model never knew. Answers are checked by
case-insensitive containment in the greedy output.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("China", "Beijing"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("Canada", "Ottawa"), ("Greece", "Athens"),
    ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Poland", "Warsaw"), ("Ireland", "Dublin"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Kenya", "Nairobi"), ("Thailand", "Bangkok"), ("Peru", "Lima"), ("Cuba", "Havana"),
    ("England", "London"), ("Argentina", "Buenos Aires"), ("Mexico", "Mexico City"), ("India", "New Delhi"),
    ("South Korea", "Seoul"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Belgium", "Brussels"),
]
WORDS = ("apple river stone cloud green window paper music silver garden yellow bridge candle orange winter "
         "forest pencil rocket valley ocean").split()


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str
    answer: str

    def correct(self, output: str) -> bool:
        return self.answer.lower() in output.lower()


def make_tasks(n_per_kind: int = 25, seed: int = 0) -> list[Task]:
    rng = random.Random(seed)
    out: list[Task] = []
    for _ in range(n_per_kind):
        a, b = rng.randint(2, 50), rng.randint(2, 50)
        out.append(Task("arithmetic", f"What is {a} + {b}? Reply with just the number.", str(a + b)))
    for _ in range(n_per_kind):
        words = " ".join(rng.sample(WORDS, 4))
        out.append(Task("copy", f"Repeat the following words exactly, nothing else: {words}", words))
    for _ in range(n_per_kind):
        start, step = rng.randint(1, 20), rng.randint(2, 9)
        seq = [start + i * step for i in range(5)]
        out.append(Task("sequence", f"Continue the sequence with the next number: {', '.join(map(str, seq))},",
                        str(start + 5 * step)))
    for country, city in rng.sample(CAPITALS, min(n_per_kind, len(CAPITALS))):
        out.append(Task("capital", f"What is the capital of {country}? Answer in one word.", city))
    return out
