"""Distillation: the training model's student equals the served SwiftKV model, training lowers
the loss, and a stopped run resumes (real SmolLM2 weights, tiny corpus, no torch.compile)."""

import json

import pytest
import torch

from modelkit.distill_config import DistillConfig, lr_at
from modelkit.distill_model import SwiftKVDistillModel, distill_loss
from modelkit.swiftkv import write_swiftkv_checkpoint
from refengine.config import EngineConfig
from refengine.engine import LLMEngine

pytestmark = [pytest.mark.slow, pytest.mark.model]


@pytest.fixture(scope="module")
def model(smollm2_dir):
    return SwiftKVDistillModel(smollm2_dir, 15, [1, 2], max_positions=128)


@pytest.mark.parametrize("g", [1, 2])
def test_student_equals_engine_through_cache(model, smollm2_dir, tmp_path, g):
    torch.manual_seed(0)
    ids = torch.randint(100, 30000, (1, 48))
    with torch.no_grad():
        h, cos, sin = model.trunk(ids)
        s_logits, _ = model.student(h, cos, sin, g)
    logp = torch.log_softmax(s_logits[0].float(), -1)
    ckpt = write_swiftkv_checkpoint(smollm2_dir, tmp_path / "ckpt", 15, g)
    eng = LLMEngine(EngineConfig(model=str(ckpt), max_model_len=128, num_kv_blocks=32))
    seq = ids[0].tolist()
    (scores,) = eng.score([(seq[:30], seq[30:])], want_dist=True)
    for j, (_, _, row) in enumerate(scores):
        assert torch.allclose(row, logp[29 + j], atol=2e-3), j


def test_training_steps_reduce_the_loss(model):
    torch.manual_seed(0)
    ids = torch.randint(100, 30000, (2, 64))
    opt = torch.optim.AdamW(model.parameters_of(1), lr=1e-3)
    losses = []
    for _ in range(4):
        h, cos, sin = model.trunk(ids)
        t, _ = model.teacher(h, cos, sin)
        s, _ = model.student(h, cos, sin, 1)
        loss = distill_loss(t, s, 2.0)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]
    # Only the SwiftKV tensors are trainable.
    assert {n.split("__")[-2] for n in model.students["1"].keys()} <= {
        "norm_swiftkv", "q_proj_swiftkv", "k_proj_swiftkv", "v_proj_swiftkv"}


def test_lr_schedule():
    cfg = DistillConfig(model="m", output="o", corpus="c", l=1, steps=100, lr=1.0, warmup=0.1)
    assert lr_at(cfg, 0) == pytest.approx(0.1) and lr_at(cfg, 9) == pytest.approx(1.0)
    assert lr_at(cfg, 99) < 0.01 and lr_at(cfg, 55) == pytest.approx(0.5, abs=0.02)


def test_run_stops_and_resumes(smollm2_dir, tmp_path, tiny_corpus):
    from modelkit.distill_train import Trainer

    cfg = DistillConfig(model=str(smollm2_dir), output=str(tmp_path / "run"), corpus=str(tiny_corpus), l=15,
                        groups=[2], seq_len=64, micro_batch=1, grad_accum=1, steps=3, compile=False, eval_every=2,
                        eval_windows=1, save_every=1, max_hours=1e-9, dtype="float32", init="lstsq", init_windows=2)
    t1 = Trainer(cfg, smollm2_dir)
    info = t1.initialise()
    assert info["tokens"] == 2 * 64 and info["heldout_kl_T1"][2] > 0
    first = t1.run()
    assert first["stopped"] and first["step"] == 1
    t2 = Trainer(cfg.__class__(**{**cfg.__dict__, "max_hours": None}), smollm2_dir)
    assert t2.load_state() and t2.step == 1
    done = t2.run()
    assert done["steps"] == 3 and (tmp_path / "run" / "swiftkv-l15-g2.safetensors").is_file()
    assert done["init"]["init"] == "lstsq" and done["init"]["tokens"] == 128
    log = [json.loads(line) for line in open(tmp_path / "run" / "train_log.jsonl")]
    assert [r["step"] for r in log] == [1, 2, 3] and "heldout_kl_g2" in log[1]

    # A new run warm-starts from the exported tensors; anything else is refused with a clear message.
    from safetensors.torch import load_file

    warm = Trainer(cfg.__class__(**{**cfg.__dict__, "output": str(tmp_path / "warm"), "init": str(tmp_path / "run")}),
                   smollm2_dir)
    warm.initialise()
    exported = load_file(str(tmp_path / "run" / "swiftkv-l15-g2.safetensors"))
    for name, t in warm.model.swiftkv_state(2).items():
        assert torch.equal(t, exported[name].float()), name
    bad = Trainer(cfg.__class__(**{**cfg.__dict__, "output": str(tmp_path / "bad"), "init": "nowhere"}), smollm2_dir)
    with pytest.raises(SystemExit, match="original.*lstsq"):
        bad.initialise()
