"""A task suite with exact answers: arithmetic, copying, sequences, capitals and
short-answer reading comprehension (the RAG case: answer from a passage).

Items are generated deterministically (seeded). An item is *kept* only if the
baseline model answers it correctly, so the suite measures what a transformation
loses, not what the small base model never knew. Answers are checked by
case-insensitive containment in the greedy output; a reading item also fails when the
output contains the distractor (the same fact of the other entity in the passage).
``make_tasks(n_per_kind)``: the capital kind is capped by its list (88 countries).
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
MORE_CAPITALS = [
    ("the Netherlands", "Amsterdam"), ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"),
    ("Vietnam", "Hanoi"), ("the Philippines", "Manila"), ("Indonesia", "Jakarta"), ("Chile", "Santiago"),
    ("Venezuela", "Caracas"), ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Scotland", "Edinburgh"),
    ("Hungary", "Budapest"), ("the Czech Republic", "Prague"), ("Romania", "Bucharest"), ("Bulgaria", "Sofia"),
    ("Nigeria", "Abuja"), ("Ghana", "Accra"), ("Ethiopia", "Addis Ababa"), ("Morocco", "Rabat"),
    ("Saudi Arabia", "Riyadh"), ("Pakistan", "Islamabad"), ("Bangladesh", "Dhaka"), ("Nepal", "Kathmandu"),
    ("Afghanistan", "Kabul"), ("Syria", "Damascus"), ("Lebanon", "Beirut"), ("Jordan", "Amman"), ("Qatar", "Doha"),
    ("Malaysia", "Kuala Lumpur"), ("Iceland", "Reykjavik"), ("Croatia", "Zagreb"), ("Serbia", "Belgrade"),
    ("Slovakia", "Bratislava"), ("Slovenia", "Ljubljana"), ("Lithuania", "Vilnius"), ("Latvia", "Riga"),
    ("Estonia", "Tallinn"), ("Uruguay", "Montevideo"), ("Ecuador", "Quito"), ("Jamaica", "Kingston"),
    ("Senegal", "Dakar"), ("Uganda", "Kampala"), ("Zimbabwe", "Harare"), ("Zambia", "Lusaka"), ("Sudan", "Khartoum"),
    ("Libya", "Tripoli"), ("Tunisia", "Tunis"), ("Algeria", "Algiers"), ("North Korea", "Pyongyang"),
    ("Cambodia", "Phnom Penh"), ("Wales", "Cardiff"), ("Belarus", "Minsk"), ("Armenia", "Yerevan"),
    ("Cyprus", "Nicosia"), ("Malta", "Valletta"), ("Albania", "Tirana"), ("Scotland", "Edinburgh"),
    ("Laos", "Vientiane"), ("Myanmar", "Naypyidaw"),
]
MORE_CAPITALS = list(dict.fromkeys(MORE_CAPITALS))
# Reading comprehension: passages about two invented organisations, one question about one fact.
NAMES = ("Maria Keller, Tom Okafor, Lena Varga, Ravi Menon, Sofia Lindqvist, Omar Haddad, Chen Wei, Ana Duarte, "
         "Jonas Weber, Priya Nair, Lucas Moreau, Emma Novak, Hiro Tanaka, Nadia Petrova, Samuel Osei").split(", ")
ORGS = ("Orion Labs, Juniper Works, Falcon Group, Cedar Systems, Harbor Analytics, Maple Robotics, Nimbus Studio, "
        "Quartz Energy, Willow Foods, Atlas Freight, Beacon Health, Coral Software").split(", ")
CITIES = ("Lisbon, Oslo, Denver, Nairobi, Osaka, Toronto, Lyon, Krakow, Austin, Melbourne, Porto, Leeds, "
          "Seville, Dublin, Munich").split(", ")
PRODUCTS = ("solar panels, delivery drones, water filters, field sensors, bicycle locks, hearing aids, "
            "weather balloons, ceramic tiles, rain jackets, school tablets").split(", ")
SENTENCES = ("{o} was founded in {year} by {person}.", "{o} has its headquarters in {city}.",
             "{o} employs {staff} people.", "The main product of {o} is {product}.")
QUESTIONS = [("Who founded {o}?", "person"), ("In which year was {o} founded?", "year"),
             ("In which city does {o} have its headquarters?", "city"),
             ("How many people does {o} employ?", "staff"), ("What is the main product of {o}?", "product")]
WORDS = ("apple river stone cloud green window paper music silver garden yellow bridge candle orange winter "
         "forest pencil rocket valley ocean").split()


@dataclass(frozen=True)
class Task:
    kind: str
    prompt: str
    answer: str

    distractor: str = ""

    def correct(self, output: str) -> bool:
        out = output.lower()
        return self.answer.lower() in out and not (self.distractor and self.distractor.lower() in out)


def _reading(rng: random.Random) -> Task:
    orgs = rng.sample(ORGS, 2)
    vals = [{"person": p, "city": c, "product": pr, "year": str(y), "staff": str(n)}
            for p, c, pr, y, n in zip(rng.sample(NAMES, 2), rng.sample(CITIES, 2), rng.sample(PRODUCTS, 2),
                                      rng.sample(range(1952, 2021), 2), rng.sample(range(12, 950), 2))]
    passage = " ".join(t.format(o=o, **v) for o, v in zip(orgs, vals) for t in SENTENCES)
    which = rng.randrange(2)
    question, slot = rng.choice(QUESTIONS)
    return Task("reading", "Answer the question using only the passage. Reply with a few words.\n\n"
                           f"Passage: {passage}\n\nQuestion: {question.format(o=orgs[which])}",
                vals[which][slot], distractor=vals[1 - which][slot])


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
    pool = CAPITALS if n_per_kind <= len(CAPITALS) else CAPITALS + MORE_CAPITALS
    for country, city in rng.sample(pool, min(n_per_kind, len(pool))):
        out.append(Task("capital", f"What is the capital of {country}? Answer in one word.", city))
    rc = random.Random(f"{seed}-reading")           # its own stream: the other kinds stay as they were
    out.extend(_reading(rc) for _ in range(n_per_kind))
    return out
