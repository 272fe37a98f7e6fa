"""The ZACK task-accuracy search's bisection, against a fake evaluation with a known threshold."""

from pathlib import Path

from studies import zack_task_search as zts


class FakeEvaluation:
    """Relative task accuracy 1.0 up to ``edge``, then falling; ZipCache alone costs ``zip_cost``."""

    def __init__(self, edge: float, zip_cost: float = 0.0):
        self.edge, self.zip_cost, self.calls = edge, zip_cost, []

    def compare(self, model, overrides):
        methods = overrides["kv_methods"]
        self.calls.append(methods)
        zack = methods["zack"]
        rate = zack["rate"] if zack else 0.0
        rel = (1.0 if rate <= self.edge else 0.9 - rate) - (self.zip_cost if "zipcache" in methods else 0.0)
        return {"task_accuracy_relative": rel, "task_accuracy_relative_ci": [rel - 0.05, rel + 0.05],
                "ppl_increase_pct": 100 * rate, "ppl_increase_pct_ci": [0, 0], "tasks_kept": 200,
                "tasks_total": 700, "kv_bytes_per_token": 100.0, "kv_bytes_per_token_16bit": 100 * (1 - rate)}


def test_bisection_finds_the_last_passing_rate():
    ev = FakeEvaluation(edge=0.1)
    got = zts.search(ev, Path("m"), "adaptive", {}, hi=0.5, steps=5, target=0.99, log=lambda s: None, base16=100.0)
    # 0 and 0.5 first, then 0.25, 0.125, 0.0625, 0.0938, 0.1094: the last pass is 0.0938.
    assert [p["rate"] for p in got["probes"]] == [0.0, 0.5, 0.25, 0.125, 0.0625, 0.0938, 0.1094]
    assert got["rate"] == 0.0938 and got["next_failing_rate"] == 0.1094
    assert abs(got["at_rate"]["combined_rate"] - 0.0938) < 1e-9
    assert not got["resolved"]               # its interval [0.95, 1.05] reaches below 0.99
    assert ev.calls[0] == {"zack": False}    # rate 0 turns the ZACK model's rotations off
    assert ev.calls[1] == {"zack": {"rate": 0.5, "mode": "adaptive"}}


def test_a_method_that_misses_alone_ends_the_search():
    ev = FakeEvaluation(edge=0.1, zip_cost=0.05)
    got = zts.search(ev, Path("m"), "adaptive", {"zipcache": {}}, hi=0.5, steps=5, target=0.99,
                     log=lambda s: None, base16=100.0)
    assert got["rate"] is None and len(got["probes"]) == 1
    assert ev.calls == [{"zipcache": {}, "zack": False}]
    assert "none (rate 0 misses)" in zts.markdown({"command": "c", "searches": [got]})
