"""benchmarks/report/swiftkv.py: summary.json takes every figure from the eval and prefill
files it is given, merges several only when they share one setup and baseline, and refuses a
variant that either file lacks."""

import json

import pytest

from benchmarks.report import swiftkv as summary_mod


def _quality(label, ppl_inc, acc, setup=None):
    r = {"model": "m", "ppl_baseline": 10.0, "ppl_increase_pct": ppl_inc, "kl": 0.1, "top1_agreement": 0.9,
         "task_accuracy": acc, "task_accuracy_relative": acc + 0.01, "task_accuracy_relative_ci": [acc - 0.04, acc + 0.05],
         "tasks_kept": 210, "tasks_total": 487, "setup": setup or {"samples": 48},
         "ppl_increase_pct_ci": [ppl_inc - 1, ppl_inc + 1], "task_accuracy_ci": [acc - 0.05, acc + 0.04],
         "kl_ci": [0.09, 0.11], "top1_agreement_ci": [0.88, 0.92]}
    return {"command": "modelkit eval ...", "results": {label: r}}


def _prefill(engine, ratios, lengths=(512, 2048)):
    rows = [{"prompt_tokens": n, "engine": "baseline", "ratio_vs_baseline_median": 1.0} for n in lengths]
    rows += [{"prompt_tokens": n, "engine": engine, "ratio_vs_baseline_median": r}
             for n, r in zip(lengths, ratios)]
    return {"command": "python -m benchmarks engine swiftkv_prefill ...", "rows": rows}


def test_summary_from_measured_files(tmp_path):
    q = summary_mod.merge([_quality("l15_g1", 33.0, 0.5), _quality("l22_g1", 4.0, 0.92)],
                          [_prefill("swiftkv l=15 g=1", [0.6, 0.5]), _prefill("swiftkv l=22 g=1", [0.8, 0.76])])
    s = summary_mod.summarise(*q)
    assert set(s["shipped"]) == {"l15_g1", "l22_g1"}
    v = s["shipped"]["l22_g1"]
    assert v["ppl_increase_pct"] == 4.0 and v["task_accuracy_kept"] == pytest.approx(0.93)
    assert v["task_retention"] == 0.92 and v["ci95"]["task_retention"] == pytest.approx([0.87, 0.96])
    assert v["prefill_time_ratio"] == pytest.approx(0.78) and v["ci95"]["kl"] == [0.09, 0.11]
    assert all(isinstance(v[k], float) for k in summary_mod.FIELDS)
    json.dumps(s)
    # l22 measured at 2048 tokens only: every variant's ratio is taken at the common length.
    s = summary_mod.summarise(*summary_mod.merge(
        [_quality("l15_g1", 33.0, 0.5), _quality("l22_g1", 4.0, 0.92)],
        [_prefill("swiftkv l=15 g=1", [0.6, 0.5]), _prefill("swiftkv l=22 g=1", [0.77], lengths=(2048,))]))
    assert s["shipped"]["l15_g1"]["prefill_time_ratio"] == 0.5 and s["prefill_lengths"] == [2048]


def test_summary_refuses_missing_or_mismatched_inputs():
    with pytest.raises(SystemExit):     # no prefill rows for l22
        summary_mod.summarise(*summary_mod.merge([_quality("l22_g1", 4.0, 0.9)],
                                                 [_prefill("swiftkv l=15 g=1", [0.6, 0.5])]))
    with pytest.raises(SystemExit):     # different eval setups
        summary_mod.merge([_quality("l15_g1", 33.0, 0.5), _quality("l22_g1", 4.0, 0.9, {"samples": 8})], [])
