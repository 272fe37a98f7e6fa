"""Fixtures shared by the modelkit tests."""

import json

import pytest


@pytest.fixture
def tiny_corpus(tmp_path):
    """A corpus directory with six short training documents and two held-out ones."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    text = "The quick brown fox jumps over the lazy dog. " * 60
    with open(corpus / "docs.jsonl", "w") as f:
        for i, split in enumerate(["train"] * 6 + ["heldout"] * 2):
            f.write(json.dumps({"id": f"d{i}", "source": "t", "license": "x", "kind": "text", "split": split,
                                "text": f"Document {i}. " + text}) + "\n")
    return corpus
