"""plot-distill: reads a train log (keeping the last record of a repeated step) and writes a PNG."""

import json

import pytest

from modelkit.cli import main
from modelkit.distill_plot import heldout_points, initial_kl, moving_average, read_log


def _write_log(run):
    recs = []
    for step in range(1, 31):
        r = {"step": step, "tokens": step * 1024, "loss_g1": 3.0 / step, "loss_g2": 8.0 / step}
        if step % 10 == 0:
            r.update(heldout_kl_g1=1.0 / step, heldout_kl_g2=2.0 / step)
        recs.append(r)
    recs.insert(11, {"step": 12, "tokens": 12 * 1024, "loss_g1": 99.0, "loss_g2": 99.0})   # written again after a resume
    run.mkdir()
    (run / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def test_read_log_keeps_last_record_per_step(tmp_path):
    _write_log(tmp_path / "run")
    recs = read_log(tmp_path / "run")
    assert [r["step"] for r in recs] == list(range(1, 31))
    assert recs[11]["loss_g1"] == pytest.approx(3.0 / 12)


def test_heldout_curve_starts_at_the_initial_point(tmp_path):
    _write_log(tmp_path / "run")
    recs = read_log(tmp_path / "run")
    assert initial_kl(tmp_path / "run") == {}
    assert heldout_points(recs, 2, initial_kl(tmp_path / "run"))[0] == (10 * 1024 / 1e6, 0.2)
    (tmp_path / "run" / "init.json").write_text(json.dumps({"init": "lstsq", "heldout_kl_T1": {"1": 0.4, "2": 1.9}}))
    pts = heldout_points(recs, 2, initial_kl(tmp_path / "run"))
    assert pts[0] == (0.0, 1.9) and len(pts) == 4


def test_moving_average():
    assert moving_average([1, 2, 3, 4], 2) == [1.0, 1.5, 2.5, 3.5]


def test_plot_command_writes_png(tmp_path, capsys):
    _write_log(tmp_path / "run")
    assert main(["plot-distill", str(tmp_path / "run")]) == 0
    png = tmp_path / "run" / "train_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    with pytest.raises(SystemExit, match="train_log.jsonl does not exist"):
        main(["plot-distill", str(tmp_path / "missing")])
