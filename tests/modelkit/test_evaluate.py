"""The evaluator behind the quality reports: metric arithmetic on hand-made inputs, and on
the real SmolLM2 the original compared with itself scores as identical while an FP8 KV
cache scores as close but not identical, with a smaller KV footprint."""

import json
import math

import pytest
import torch

from modelkit.eval_stats import wilson
from modelkit.evaluate import Evaluation, greedy_metrics, markdown_table, score_metrics
from modelkit.tasks import CAPITALS, MORE_CAPITALS, make_tasks


def test_greedy_metrics():
    same = greedy_metrics([[1, 2, 3, 4]], [[1, 2, 3, 4]])
    assert same == {"greedy_token_agreement": 1.0, "greedy_prefix_agreement": 1.0, "greedy_exact_match": 1.0}
    # Diverges at position 2; position 3 agrees again; the longer output sets the length.
    m = greedy_metrics([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4, 7], [5, 6]])
    assert m["greedy_token_agreement"] == pytest.approx(5 / 7)
    assert m["greedy_prefix_agreement"] == pytest.approx((2 / 5 + 1) / 2)
    assert m["greedy_exact_match"] == 0.5
    assert greedy_metrics([], [])["greedy_token_agreement"] is None


def test_score_metrics():
    p = torch.tensor([0.5, 0.25, 0.25]).log()
    q = torch.tensor([0.25, 0.5, 0.25]).log()
    base = [[(float(p[0]), 0, p), (float(p[1]), 0, p)]]
    same = score_metrics(base, base)
    assert same["ppl_increase_pct"] == pytest.approx(0.0) and same["kl"] == pytest.approx(0.0)
    assert same["top1_agreement"] == 1.0 and same["positions"] == 2
    other = score_metrics(base, [[(float(q[0]), 1, q), (float(q[1]), 1, q)]])
    assert other["top1_agreement"] == 0.0
    assert other["kl"] == pytest.approx(float((p.exp() * (p - q)).sum()))
    # Same mean log-probability of the true tokens (log .5 + log .25 both ways): same perplexity.
    assert other["ppl"] == pytest.approx(math.exp(-(math.log(0.5) + math.log(0.25)) / 2))
    assert other["ppl_increase_pct"] == pytest.approx(0.0)


def test_intervals():
    assert wilson(0, 0) is None
    lo, hi = wilson(30, 100)
    assert lo < 0.3 < hi and wilson(0, 20)[0] == 0.0 and wilson(20, 20)[1] == 1.0
    assert hi - lo > wilson(300, 1000)[1] - wilson(300, 1000)[0]        # more items, narrower
    # Five sequences, the model worse on two of them: the interval holds the point estimate and
    # is not degenerate; identical scores give a zero-width interval at 0.
    p, q = torch.tensor([0.5, 0.25, 0.25]).log(), torch.tensor([0.25, 0.5, 0.25]).log()
    base = [[(float(p[0]), 0, p)] * 4 for _ in range(5)]
    model = [[(float(q[0]), 1, q)] * 4] * 2 + base[2:]
    m = score_metrics(base, model)
    for k in ("ppl_increase_pct", "kl", "top1_agreement"):
        assert m[k + "_ci"][0] <= m[k] <= m[k + "_ci"][1] and m[k + "_ci"][0] < m[k + "_ci"][1], k
    assert score_metrics(base, base)["ppl_increase_pct_ci"] == pytest.approx([0.0, 0.0], abs=1e-9)
    cell = markdown_table({"a": m}).splitlines()[4]
    assert cell.startswith("| top-1 agreement (teacher-forced) | 60.0% [") and "%, " in cell


def test_task_suite_reading_items():
    suite = make_tasks(40)
    kinds = {t.kind for t in suite}
    assert kinds == {"arithmetic", "copy", "sequence", "capital", "reading"} and len(suite) == 200
    assert [t.prompt for t in make_tasks(40)] == [t.prompt for t in suite]          # deterministic
    for t in (t for t in suite if t.kind == "reading"):
        assert t.answer in t.prompt and t.distractor in t.prompt and t.answer != t.distractor
        assert t.correct(f"It is {t.answer}.") and not t.correct(f"{t.answer} or {t.distractor}")
    assert len([t for t in make_tasks(200) if t.kind == "capital"]) == len(CAPITALS) + len(MORE_CAPITALS)


def test_paired_ratio_counts_the_models_own_solves():
    from modelkit.eval_stats import paired_ratio

    base = [True] * 8 + [False] * 12
    model = [True] * 6 + [False] * 2 + [True] * 4 + [False] * 8      # 2 lost, 4 gained
    ratio, ci = paired_ratio(base, model)
    assert ratio == pytest.approx(10 / 8) and ci[0] < ratio < ci[1]
    assert paired_ratio(base, base)[0] == 1.0 and paired_ratio([False] * 3, [True] * 3) == (None, None)
    with pytest.raises(ValueError):
        paired_ratio(base, model[:-1])


def test_markdown_table_marks_missing_values():
    table = markdown_table({"a": {"ppl": 12.0, "kl": None}})
    assert "| ppl through cache | 12.000 |" in table and "| KL(original || model) | n/a |" in table


@pytest.mark.slow
@pytest.mark.model
def test_original_against_itself_and_fp8(smollm2_dir, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    docs = [("The history of the printing press begins with movable type in East Asia. " * 12),
            ("def add(a, b):\n    return a + b\n\n" * 20), ("Rivers carry water from mountains to the sea. " * 15)]
    with open(corpus / "docs.jsonl", "w") as f:
        for i, text in enumerate(docs):
            f.write(json.dumps({"id": f"d{i}", "source": "t", "license": "x", "kind": "text", "split": "heldout",
                                "text": text}) + "\n")
    ev = Evaluation(smollm2_dir, corpus, n_score=3, prefix=48, cont=16, n_gen=0, task_items=4)
    assert ev.tasks, "the task suite keeps the items the original solves"
    same = ev.compare(smollm2_dir, {})
    assert same["ppl_increase_pct"] == pytest.approx(0.0, abs=1e-6) and same["top1_agreement"] == 1.0
    assert same["kl"] == pytest.approx(0.0, abs=1e-6) and same["task_accuracy"] == 1.0
    assert same["task_accuracy_ci"][1] == 1.0 and same["task_accuracy_ci"][0] < 1.0
    assert same["task_accuracy_relative"] == 1.0 and same["tasks_solved_only_by_model"] == 0
    assert same["tasks_solved_model"] == same["tasks_kept"] < same["tasks_total"]
    assert same["kl_ci"] == pytest.approx([0.0, 0.0], abs=1e-6)
    fp8 = ev.compare(smollm2_dir, {"kv_cache_dtype": "fp8_e4m3"})
    assert 0 < fp8["kl"] < 0.1 and fp8["kv_bytes_per_token"] < same["kv_bytes_per_token"]


@pytest.mark.model
def test_needle_items_hide_one_answer_among_distractors(smollm2_dir, tmp_path):
    from transformers import AutoTokenizer

    from modelkit.needle import make_items

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    with open(corpus / "docs.jsonl", "w") as f:
        for i in range(4):
            f.write(json.dumps({"id": f"d{i}", "split": "heldout", "text": f"Filler paragraph {i} about rivers. " * 30})
                    + "\n")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    items = make_items(corpus, tok, 4, 512, seed=1)
    assert [it.depth for it in items] == [0.125, 0.375, 0.625, 0.875]
    for it in items:
        text = tok.decode(it.prompt)
        assert abs(len(it.prompt) - 512) <= 16
        name = text.rsplit("The pass key of ", 1)[1].removesuffix(" is")
        assert text.count(f"The pass key of {name} is {it.answer}.") == 1          # the needle, once
        assert text.count("The pass key of ") == 5                                # + 3 distractors + the question
        assert text.count(f" is {it.answer}.") == 1                                # no distractor shares the key


def test_model_args_are_per_label_and_refuse_unknown_labels():
    from modelkit.evaluate_cli import model_args

    got = model_args(["bf16:dtype=bfloat16", "q4:load_format=gguf", "bf16:max_num_seqs=4"], ["bf16", "q4", "other"])
    assert got == {"bf16": {"dtype": "bfloat16", "max_num_seqs": 4}, "q4": {"load_format": "gguf"}}
    with pytest.raises(SystemExit, match="no --model is labelled 'q8'"):
        model_args(["q8:dtype=float32"], ["bf16"])
    with pytest.raises(SystemExit, match="LABEL:KEY=VALUE"):
        model_args(["dtype=float32"], ["bf16"])


def test_eval_names_a_missing_corpus_before_loading_anything(tmp_path):
    from modelkit.cli import main

    with pytest.raises(SystemExit, match=r"no corpus at .*build-corpus --output"):
        main(["eval", "--corpus", str(tmp_path / "none"), "--model", "not-a-model", "--metrics", "ppl"])
