"""Distillation corpus built without any hub: texts that ship with this machine's
Debian and Python packages, plus instructions answered by the teacher model itself.

Sources (each document records its source and licence; see ``SOURCES``):
  nodejs-api      Node.js API reference, Markdown      /usr/share/doc/nodejs/api/*.md      MIT
  cpython-news    CPython changelog                    /usr/share/doc/python3.*/NEWS.gz    PSF-2.0
  git-relnotes    Git release notes                    /usr/share/doc/git/RelNotes/*.txt   GPL-2.0-only
  python-stdlib   Python standard library source       <sys.prefix>/lib/python3.X/**.py    PSF-2.0
  licenses        Licence texts                        /usr/share/common-licenses/*        verbatim copying permitted
  teacher-chat    Instructions (RAG-style questions on passages of the sources above, code
                  explanations, general tasks written for this project) answered by the model
                  being distilled (the teacher), as ZACK builds its calibration set from
                  generated text. Licence: the passages' licences; answers are model output.

Documents are split into train and held-out by a hash of their id (``heldout_fraction``),
so held-out passages and the chat prompts built from them are never trained on.

Stages (``modelkit build-corpus``): ``collect`` writes ``docs.jsonl``; ``chat`` writes
``chat.jsonl`` incrementally (resumable: done ids are skipped) using the reference
engine; ``manifest.json`` lists every source with licence, document count, bytes
and sha256 of the files read.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import json
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator


@dataclass(frozen=True)
class Source:
    name: str
    license: str
    kind: str                      # "text" | "code"
    files: Callable[[], list[str]]


def _stdlib_files() -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "turtledemo", "lib2to3", "site-packages", "ensurepip", "tkinter")
    return sorted(str(p) for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts))


SOURCES = [
    Source("nodejs-api", "MIT", "text", lambda: sorted(glob.glob("/usr/share/doc/nodejs/api/*.md"))),
    Source("cpython-news", "PSF-2.0", "text", lambda: sorted(glob.glob("/usr/share/doc/python3.*/NEWS.gz"))),
    Source("git-relnotes", "GPL-2.0-only", "text", lambda: sorted(glob.glob("/usr/share/doc/git/RelNotes/*.txt"))),
    Source("python-stdlib", "PSF-2.0", "code", _stdlib_files),
    Source("licenses", "verbatim copying permitted", "text",
           lambda: sorted(p for p in glob.glob("/usr/share/common-licenses/*") if Path(p).is_file())),
]


def _read(path: str) -> bytes:
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
        return f.read()


def _split_sections(text: str, max_chars: int) -> list[str]:
    """Split long files at blank lines into documents of at most ~max_chars."""
    out, cur = [], []
    size = 0
    for para in text.split("\n\n"):
        if size + len(para) > max_chars and cur:
            out.append("\n\n".join(cur))
            cur, size = [], 0
        cur.append(para)
        size += len(para) + 2
    if cur:
        out.append("\n\n".join(cur))
    return [d for d in out if len(d.strip()) > 200]


def is_heldout(doc_id: str, fraction: float) -> bool:
    h = int(hashlib.sha256(doc_id.encode()).hexdigest()[:8], 16)
    return h < fraction * 0xFFFFFFFF


def collect(out_dir: Path, heldout_fraction: float = 0.05, max_doc_chars: int = 6000) -> dict:
    """Write docs.jsonl (all sources) and return the manifest's source entries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    with open(out_dir / "docs.jsonl", "w") as f:
        for src in SOURCES:
            files = src.files()
            sha = hashlib.sha256()
            n_docs = n_bytes = 0
            for path in files:
                raw = _read(path)
                sha.update(raw)
                text = raw.decode("utf-8", errors="replace")
                for i, doc in enumerate(_split_sections(text, max_doc_chars)):
                    doc_id = f"{src.name}:{Path(path).name}:{i}"
                    split = "heldout" if is_heldout(doc_id, heldout_fraction) else "train"
                    f.write(json.dumps({"id": doc_id, "source": src.name, "license": src.license,
                                        "kind": src.kind, "split": split, "text": doc}) + "\n")
                    n_docs += 1
                    n_bytes += len(doc.encode())
            entries.append({"source": src.name, "license": src.license, "files": len(files), "documents": n_docs,
                            "bytes": n_bytes, "sha256_of_files": sha.hexdigest()})
    return {"sources": entries, "heldout_fraction": heldout_fraction}


def missing(corpus_dir: Path) -> str | None:
    """Why ``corpus_dir`` cannot be read as a corpus (it has no docs.jsonl), naming how to build one;
    None when it can. For commands to ask before minutes of other work, not at the first read."""
    if (Path(corpus_dir) / "docs.jsonl").is_file():
        return None
    return (f"no corpus at {corpus_dir} (no docs.jsonl): build one with `modelkit build-corpus --output "
            f"{corpus_dir}` (docs/swiftkv.md gives the settings of the corpora the shipped checkpoints used)")


def iter_docs(corpus_dir: Path, split: str | None = None) -> Iterator[dict]:
    with open(corpus_dir / "docs.jsonl") as f:
        for line in f:
            d = json.loads(line)
            if split is None or d["split"] == split:
                yield d


# ---- teacher-answered instructions --------------------------------------------------
PASSAGE_TEMPLATES = [
    "Summarize the following text in a few sentences.\n\n{p}",
    "Read the passage and list its three most important points.\n\n{p}",
    "{p}\n\nWhat is the main topic of the text above? Answer briefly.",
    "Context:\n{p}\n\nQuestion: What problem does this section address, and how?",
    "Rewrite the following text in simpler words for a beginner.\n\n{p}",
    "Here is a document:\n\n{p}\n\nWrite a one-line title for it.",
]
CODE_TEMPLATES = [
    "Explain what the following Python code does.\n\n```python\n{p}\n```",
    "Review this Python code and suggest one improvement.\n\n```python\n{p}\n```",
    "```python\n{p}\n```\n\nDescribe the purpose of each function above in one sentence.",
]
GENERAL = [
    "Explain {t} to a beginner in a short paragraph.", "Give three practical tips about {t}.",
    "Write a short story that involves {t}.", "What are the advantages and disadvantages of {t}?",
    "Write a haiku about {t}.", "Describe {t} in exactly two sentences.",
]
TOPICS = [
    "photosynthesis", "the water cycle", "compound interest", "binary search", "the French Revolution",
    "volcanoes", "healthy sleep", "public speaking", "recursion in programming", "climate change",
    "the solar system", "learning a new language", "bread baking", "electric cars", "the human heart",
    "version control with git", "the Pythagorean theorem", "time management", "honeybees", "the Roman Empire",
    "neural networks", "recycling", "chess openings", "the stock market", "mountain hiking",
    "HTTP requests", "prime numbers", "ocean tides", "gardening", "renewable energy",
]


def chat_prompts(corpus_dir: Path, n_train: int, n_heldout: int, seed: int = 0,
                 min_chars: int = 600, max_chars: int = 2400) -> list[dict]:
    """Deterministic list of chat prompts: ~70% passage questions, ~15% code, ~15% general.

    Each split draws from its own seeded RNG, so asking for more training prompts keeps
    the held-out prompts (and the first training prompts) unchanged.
    """
    pools: dict[str, list[dict]] = {"train": [], "heldout": []}
    for d in iter_docs(corpus_dir):
        if len(d["text"]) >= min_chars:
            pools[d["split"]].append(d)
    out = []
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        rng = random.Random(f"{seed}-{split}")
        docs = pools[split]
        rng.shuffle(docs)
        for i in range(n):
            r = rng.random()
            if r < 0.15 or not docs:
                t = rng.choice(TOPICS)
                prompt, src, lic = rng.choice(GENERAL).format(t=t), "teacher-chat:general", "project"
            else:
                d = docs[i % len(docs)]
                text = d["text"]
                start = rng.randrange(0, max(1, len(text) - max_chars))
                start = text.find("\n", start) + 1 if start else 0   # begin at a line boundary
                end = start + rng.randint(min_chars, max_chars)
                end = max(text.rfind("\n", start, end), start + min_chars // 2)
                passage = text[start:end].strip()
                templates = CODE_TEMPLATES if d["kind"] == "code" else PASSAGE_TEMPLATES
                prompt, src, lic = rng.choice(templates).format(p=passage), f"teacher-chat:{d['source']}", d["license"]
            out.append({"id": f"chat-{split}-{i}", "split": split, "source": src, "license": lic,
                        "messages": [{"role": "user", "content": prompt}]})
    return out


def generate_answers(corpus_dir: Path, model_dir: Path, prompts: list[dict], max_tokens: int = 160,
                     batch: int = 32, seed: int = 0, max_prompt_tokens: int = 900, dtype: str = "auto") -> int:
    """Answer prompts with the teacher via the reference engine; append to chat.jsonl. Resumable."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from refengine.config import EngineConfig
    from refengine.engine import LLMEngine
    from refengine.sampling_params import SamplingParams

    path = corpus_dir / "chat.jsonl"
    done = set()
    if path.exists():
        with open(path) as f:
            done = {json.loads(line)["id"] for line in f}
    todo = [p for p in prompts if p["id"] not in done]
    if not todo:
        return 0
    tok = AutoTokenizer.from_pretrained(model_dir)
    # "auto" = float32 on CPU (bf16 GEMMs with few rows, i.e. decode steps, are ~2x slower than
    # fp32 on this CPU), bfloat16 on CUDA. Answers are data, not a reference.
    eng = LLMEngine(EngineConfig(model=str(model_dir), max_model_len=2048, kv_cache_memory_gb=1.0,
                                 max_num_seqs=batch, seed=seed, dtype=dtype))
    bar = tqdm(total=len(todo), desc="teacher answers", unit="prompt")
    with open(path, "a") as f:
        for i in range(0, len(todo), batch):
            group = todo[i:i + batch]
            ids = []
            for p in group:
                t = chat_ids(tok, p["messages"], add_generation_prompt=True)
                ids.append(t[-max_prompt_tokens:] if len(t) > max_prompt_tokens else t)
            params = [SamplingParams(max_tokens=max_tokens, temperature=0.7, top_p=0.9,
                                     seed=seed * 1_000_003 + int(p["id"].rsplit("-", 1)[1])) for p in group]
            outs = eng.generate(ids, params)
            for p, o in zip(group, outs):
                answer = tok.decode(o, skip_special_tokens=True).strip()
                rec = dict(p, messages=p["messages"] + [{"role": "assistant", "content": answer}])
                f.write(json.dumps(rec) + "\n")
            f.flush()
            bar.update(len(group))
    bar.close()
    return len(todo)


def chat_ids(tok, messages: list[dict], add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered with the model's chat template. (Recent
    transformers return a BatchEncoding from ``tokenize=True``, older ones a list.)"""
    t = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True)
    return list(t["input_ids"] if hasattr(t, "keys") else t)


def iter_chat(corpus_dir: Path, split: str | None = None) -> Iterator[dict]:
    path = corpus_dir / "chat.jsonl"
    if not path.exists():
        return
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            if split is None or d["split"] == split:
                yield d


def build(out_dir: Path, model_dir: Path, n_chat_train: int, n_chat_heldout: int, seed: int = 0,
          heldout_fraction: float = 0.05, max_answer_tokens: int = 160, dtype: str = "auto") -> dict:
    manifest = collect(out_dir, heldout_fraction)
    prompts = chat_prompts(out_dir, n_chat_train, n_chat_heldout, seed)
    generate_answers(out_dir, model_dir, prompts, max_tokens=max_answer_tokens, seed=seed, dtype=dtype)
    manifest.update({"teacher": model_dir.name, "teacher_dtype": dtype, "chat_train": n_chat_train,
                     "chat_heldout": n_chat_heldout, "max_answer_tokens": max_answer_tokens,
                     "seed": seed, "python": sys.version.split()[0]})
    counts: dict[str, int] = {}
    for d in iter_docs(out_dir):
        counts[f"docs_{d['split']}"] = counts.get(f"docs_{d['split']}", 0) + 1
    for d in iter_chat(out_dir):
        counts[f"chat_{d['split']}"] = counts.get(f"chat_{d['split']}", 0) + 1
    manifest["counts"] = counts
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest
