"""The distillation cache: the top-k loss is the full KL when k covers the vocabulary and
a lower bound otherwise; a cached run trains the same as the uncached one (real SmolLM2,
k = vocabulary, float32 storage), later visits hit the cache, a resumed run recomputes
nothing, and a cache written for other settings is refused."""

import json

import pytest
import torch

from modelkit.distill_config import DistillConfig
from modelkit.distill_cache import WindowCache, teacher_targets, topk_kl
from modelkit.distill_model import distill_loss


def test_topk_kl_is_exact_with_all_tokens_and_a_lower_bound_with_few():
    torch.manual_seed(0)
    t, s = torch.randn(3, 5, 50) * 3, torch.randn(3, 5, 50) * 3
    full = distill_loss(t, s, 2.0)
    exact = topk_kl(s, **teacher_targets(t, 50, 2.0), temperature=2.0)
    assert exact == pytest.approx(float(full), rel=1e-5)
    low = topk_kl(s, **teacher_targets(t, 5, 2.0), temperature=2.0)
    assert 0 < float(low) < float(full)
    assert float(topk_kl(t, **teacher_targets(t, 5, 2.0), temperature=2.0)) == pytest.approx(0.0, abs=1e-5)
    s.requires_grad_(True)
    topk_kl(s, **teacher_targets(t, 5, 2.0), temperature=2.0).backward()
    assert s.grad.abs().sum() > 0


def test_cache_refuses_other_settings_and_other_windows(tmp_path):
    c = WindowCache(tmp_path, {"l": 22, "topk": 64})
    ids = torch.arange(8)
    c.put(3, {"ids": ids, "h": torch.ones(8, 4)})
    assert c.get(3, ids)["h"].sum() == 32 and c.get(4, ids) is None and (c.hits, c.misses) == (1, 1)
    with pytest.raises(SystemExit):
        c.get(3, ids + 1)
    with pytest.raises(SystemExit):
        WindowCache(tmp_path, {"l": 15, "topk": 64})
    assert WindowCache(tmp_path, {"l": 22, "topk": 64}).count() == 1


def _cfg(smollm2_dir, corpus, out, **kw):
    base = dict(model=str(smollm2_dir), output=str(out), corpus=str(corpus), l=26, groups=[1], seq_len=32,
                micro_batch=2, grad_accum=1, steps=4, lr=1e-3, warmup=0.0, dtype="float32", compile=False,
                eval_every=100, eval_windows=1, save_every=1, train_windows=2, threads=2)
    base.update(kw)
    return DistillConfig(**base)


@pytest.mark.slow
@pytest.mark.model
def test_cached_training_matches_uncached_and_resumes(smollm2_dir, tiny_corpus, tmp_path):
    from modelkit.distill_train import Trainer

    plain = Trainer(_cfg(smollm2_dir, tiny_corpus, tmp_path / "plain"), smollm2_dir)
    plain.run()
    cache = tmp_path / "cache"
    cfg = _cfg(smollm2_dir, tiny_corpus, tmp_path / "cached", cache=str(cache), topk=49152, cache_dtype="float32",
               hidden_mse=0.0)
    cached = Trainer(cfg, smollm2_dir)
    cached.run()
    logs = [[json.loads(x) for x in open(tmp_path / d / "train_log.jsonl")] for d in ("plain", "cached")]
    for a, b in zip(*logs):                 # same windows, same loss (exact top-k), same updates
        assert b["loss_g1"] == pytest.approx(a["loss_g1"], rel=2e-3, abs=1e-5)
    # 2 windows, micro-batch 2: step 1 computes both, steps 2-4 take them from the cache.
    assert (logs[1][0]["cache_misses"], logs[1][-1]["cache_hits"]) == (2, 6)
    for k, v in plain.model.swiftkv_state(1).items():
        assert torch.allclose(v, cached.model.swiftkv_state(1)[k], atol=1e-4), k
    # A longer rerun resumes from state.pt and finds every window cached.
    more = Trainer(_cfg(smollm2_dir, tiny_corpus, tmp_path / "cached2", cache=str(cache), topk=49152,
                        cache_dtype="float32", steps=2), smollm2_dir)
    more.run()
    assert more.cache.misses == 0 and more.cache.hits == 4
    with pytest.raises(SystemExit):        # another k on the same directory
        Trainer(_cfg(smollm2_dir, tiny_corpus, tmp_path / "x", cache=str(cache), topk=8), smollm2_dir)


@pytest.mark.slow
@pytest.mark.model
def test_hidden_mse_term_is_cached_and_trains(smollm2_dir, tiny_corpus, tmp_path):
    from modelkit.distill_train import Trainer

    t = Trainer(_cfg(smollm2_dir, tiny_corpus, tmp_path / "mse", cache=str(tmp_path / "c"), topk=16,
                     hidden_mse=1.0, steps=3), smollm2_dir)
    t.run()
    rec = torch.load(next((tmp_path / "c").glob("w*.pt")), weights_only=True)
    assert rec["penult"].shape == rec["h"].shape == (32, 576) and rec["idx"].shape == (32, 16)
    losses = [json.loads(x)["loss_g1"] for x in open(tmp_path / "mse" / "train_log.jsonl")]
    assert losses[-1] < losses[0]
