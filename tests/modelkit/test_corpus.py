"""Corpus prompts: deterministic, split-pure, and the held-out set does not move when the
training set grows (no model needed)."""

import json

from modelkit.corpus import chat_prompts, is_heldout


def _corpus(tmp_path):
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(40):
            split = "heldout" if i % 5 == 0 else "train"
            text = "\n".join(f"{split} document {i} line {j}: some words about topic {i}." for j in range(40))
            f.write(json.dumps({"id": f"d{i}", "source": f"src{i}", "license": "x", "kind": "text",
                                "split": split, "text": text}) + "\n")
    return tmp_path


def test_more_training_prompts_keep_the_heldout_prompts(tmp_path):
    corpus = _corpus(tmp_path)
    small = chat_prompts(corpus, 8, 6, seed=3)
    large = chat_prompts(corpus, 40, 6, seed=3)
    held = [p for p in small if p["split"] == "heldout"]
    assert held == [p for p in large if p["split"] == "heldout"] and len(held) == 6
    assert [p for p in small if p["split"] == "train"] == [p for p in large if p["split"] == "train"][:8]
    assert chat_prompts(corpus, 8, 6, seed=3) == small
    assert chat_prompts(corpus, 8, 6, seed=4) != small


def test_prompts_quote_only_their_own_split(tmp_path):
    corpus = _corpus(tmp_path)
    for p in chat_prompts(corpus, 30, 10):
        content = p["messages"][0]["content"]
        other = "heldout document" if p["split"] == "train" else "train document"
        assert other not in content, p["id"]
        if p["source"] != "teacher-chat:general":
            assert f"{p['split']} document" in content


def test_heldout_fraction_is_respected():
    ids = [f"src:file{i}.txt:{i % 7}" for i in range(4000)]
    frac = sum(is_heldout(i, 0.05) for i in ids) / len(ids)
    assert 0.035 < frac < 0.065
