"""The prompt-heavy workload of the speculative-decoding benchmark, built from the project's corpus.

Four tasks whose answers reuse their prompt, as RAG, summarisation, code editing and extraction do,
each on texts ``modelkit.corpus`` collects from this machine's packages (no download):

  summary_quotes   a documentation / changelog section (Node.js API docs, CPython NEWS, Git release
                   notes): summarise it, quoting its key sentences word for word
  code_edit        one function of the Python standard library (3-40 lines): add a docstring and
                   rename one of its variables, returning the whole function
  passage_qa       a section + a question about a word it uses: answer by quoting the passage
  extract_json     a section: the names it mentions (functions, options, commands) as a JSON object

Documents come from the corpus's held-out split first (``modelkit.corpus.is_heldout``), chosen
by a seeded shuffle, between ``MIN_CHARS`` and ``MAX_CHARS`` characters (about 300-1200 prompt
tokens); tasks take turns. ``prompt_heavy_set(n, seed)`` returns ``loadtest`` request specs
(chat messages) with ``max_tokens``.
"""

from __future__ import annotations

import ast
import random
import re
from pathlib import Path

from loadtest.datasets import RequestSpec
from modelkit.corpus import SOURCES, _read, _split_sections, is_heldout

MIN_CHARS, MAX_CHARS = 1200, 4500
TASKS = ("summary_quotes", "code_edit", "passage_qa", "extract_json")


def _sections(kinds: tuple[str, ...], seed: int, limit: int) -> list[str]:
    """Up to ``limit`` corpus sections of the given source kinds ("text"/"code"), held-out ones first."""
    docs = []
    for src in SOURCES:
        if src.kind not in kinds or src.name == "licenses":
            continue
        for path in src.files():
            text = _read(path).decode("utf-8", errors="replace")
            for i, doc in enumerate(_split_sections(text, MAX_CHARS)):
                if MIN_CHARS <= len(doc) <= MAX_CHARS:
                    docs.append((not is_heldout(f"{src.name}:{Path(path).name}:{i}", 0.05), doc))
    rng = random.Random(seed)
    rng.shuffle(docs)
    docs.sort(key=lambda d: d[0])                       # held-out first (stable: shuffled within)
    return [d for _, d in docs[:limit]]


def _functions(seed: int, limit: int) -> list[str]:
    """Functions of 3-40 lines from the standard library sources of the corpus."""
    src = next(s for s in SOURCES if s.name == "python-stdlib")
    files = src.files()
    rng = random.Random(seed)
    rng.shuffle(files)
    out = []
    for path in files:
        try:
            text = Path(path).read_text()
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 3 <= node.end_lineno - node.lineno <= 40:
                body = "\n".join(lines[node.lineno - 1:node.end_lineno])
                names = sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
                if names and 200 <= len(body) <= MAX_CHARS:
                    out.append((body, names[0]))
                    break
        if len(out) >= limit:
            break
    return out


def _keyword(doc: str, rng: random.Random) -> str:
    words = [w for w in re.findall(r"[A-Za-z_][A-Za-z_.]{6,}", doc)]
    return rng.choice(words) if words else doc.split()[0]


def prompt_heavy_set(n: int, seed: int = 0, max_tokens: int = 160) -> list[RequestSpec]:
    """``n`` chat requests cycling through ``TASKS`` (deterministic for a seed)."""
    per = -(-n // len(TASKS))
    texts = _sections(("text",), seed, 3 * per)
    funcs = _functions(seed, per)
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = TASKS[i % len(TASKS)]
        j = i // len(TASKS)
        if task == "code_edit":
            fn, var = funcs[j % len(funcs)]
            content = (f"Add a one-line docstring to this function and rename the variable `{var}` to "
                       f"`{var}_value`. Return the complete updated function.\n\n```python\n{fn}\n```")
        else:
            doc = texts[(3 * j + TASKS.index(task)) % len(texts)]
            content = {
                "summary_quotes": "Summarize the following text in a few sentences, quoting its two most important "
                                  "sentences word for word.\n\n" + doc,
                "passage_qa": f"{doc}\n\nUsing only the passage above, what does it say about `{_keyword(doc, rng)}`? "
                              "Answer by quoting the relevant sentences.",
                "extract_json": "List every function, option, command or file name mentioned in the text below as "
                                'a JSON object {"names": [...]}. Answer with the JSON only.\n\n' + doc,
            }[task]
        out.append(RequestSpec(None, [{"role": "user", "content": content}], max_tokens))
    return out
