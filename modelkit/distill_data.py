"""Token windows for distillation, built from a corpus directory (see modelkit.corpus).

Documents (text, code) and teacher-answered chats (rendered with the model's chat
template) are tokenised, shuffled with a seed, concatenated (EOS between documents)
and cut into fixed ``seq_len`` windows. Chats can be repeated (``chat_repeats``) to
weight the instruction-following data. The result is cached next to the corpus as
``windows-{split}-{seq_len}-{repeats}-{seed}.pt`` (a LongTensor [N, seq_len]).
"""

from __future__ import annotations

import random
from pathlib import Path

import torch


def load_windows(corpus_dir: Path, model_dir: Path, split: str, seq_len: int, chat_repeats: int = 1,
                 seed: int = 0) -> torch.Tensor:
    cache = corpus_dir / f"windows-{split}-{seq_len}-{chat_repeats}-{seed}.pt"
    if cache.exists():
        return torch.load(cache)
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from modelkit.corpus import chat_ids, iter_chat, iter_docs

    tok = AutoTokenizer.from_pretrained(model_dir)
    eos = tok.eos_token_id
    seqs: list[list[int]] = []
    docs = list(iter_docs(corpus_dir, split))
    for d in tqdm(docs, desc=f"tokenising {split} documents", unit="doc"):
        seqs.append(tok(d["text"])["input_ids"] + [eos])
    for c in iter_chat(corpus_dir, split):
        seqs.extend([chat_ids(tok, c["messages"])] * chat_repeats)
    if not seqs:
        raise SystemExit(f"corpus {corpus_dir} has no {split} documents; run `modelkit build-corpus` first")
    random.Random(seed).shuffle(seqs)
    flat = [t for s in seqs for t in s]
    n = len(flat) // seq_len
    windows = torch.tensor(flat[:n * seq_len], dtype=torch.long).view(n, seq_len)
    torch.save(windows, cache)
    return windows
