"""The distillation training loop (see modelkit.distill for the method and the CLI).

``Trainer(cfg, base_dir).run()`` trains every student of ``cfg.groups`` together,
saves ``state.pt`` atomically every ``save_every`` steps (``load_state`` resumes),
evaluates held-out KL every ``eval_every`` steps and exports bf16 tensors at the end.
With ``cfg.cache`` each micro-batch takes the trunk's hidden state and the teacher's
top-k targets from modelkit.distill_cache (computing and storing the missing windows)
and runs only the students.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from modelkit.distill_config import DistillConfig, lr_at
from modelkit.distill_cache import WindowCache, teacher_targets, topk_kl
from modelkit.distill_data import load_windows
from modelkit.distill_model import SwiftKVDistillModel, distill_loss


def tensor_file(run_dir: Path, l: int, g: int, prefix: str = "swiftkv-") -> Path:
    """Where a run keeps student g's exported tensors (``init-`` prefix: its starting point)."""
    return Path(run_dir) / f"{prefix}l{l}-g{g}.safetensors"


class Trainer:
    def __init__(self, cfg: DistillConfig, base_dir: Path):
        self.cfg = cfg
        self.out = Path(cfg.output)
        self.out.mkdir(parents=True, exist_ok=True)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                                   ("cpu" if cfg.device == "auto" else cfg.device))
        self.amp = None if cfg.dtype == "float32" else getattr(torch, cfg.dtype)
        # On CUDA the frozen copy is stored in the autocast dtype to halve its memory.
        frozen_dtype = self.amp if (self.amp and self.device.type == "cuda") else torch.float32
        self.model = SwiftKVDistillModel(base_dir, cfg.l, cfg.groups, frozen_dtype, self.device,
                                         max_positions=cfg.seq_len)
        self.loss_fn = distill_loss
        params = []
        for g in cfg.groups:
            for name, p in self.model.students[str(g)].items():
                params.append({"params": [p], "weight_decay": 0.0 if "norm" in name else cfg.weight_decay})
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95))
        self.train = load_windows(Path(cfg.corpus), base_dir, "train", cfg.seq_len, cfg.chat_repeats, cfg.seed)
        self.heldout = load_windows(Path(cfg.corpus), base_dir, "heldout", cfg.seq_len, 1, cfg.seed)[:cfg.eval_windows]
        # Row r of self.train is window self.train_ids[r] of the corpus (the cache's key).
        self.train_ids = torch.arange(len(self.train))
        self.corpus_train = self.train          # the least-squares start may draw from all of them
        if 0 < cfg.train_windows < len(self.train):
            self.train_ids = torch.randperm(len(self.train), generator=torch.Generator().manual_seed(cfg.seed + 2))
            self.train_ids = self.train_ids[:cfg.train_windows]
            self.train = self.train[self.train_ids]
        self.cache = None
        if cfg.cache:
            self.cache = WindowCache(cfg.cache, {
                "model": str(base_dir), "l": cfg.l, "seq_len": cfg.seq_len, "topk": cfg.topk,
                "temperature": cfg.temperature, "corpus": str(Path(cfg.corpus).resolve()),
                "chat_repeats": cfg.chat_repeats, "seed": cfg.seed, "dtype": cfg.cache_dtype,
                "autocast": cfg.dtype})
        self.step = 0
        self.tokens_seen = 0
        self.elapsed = 0.0
        self._fwd = torch.compile(self._forward) if cfg.compile else self._forward

    def initialise(self) -> dict:
        """Apply ``cfg.init`` to a fresh run (a resumed run takes its tensors from state.pt)."""
        from modelkit.distill_init import fit_swiftkv_kv

        cfg = self.cfg
        info: dict = {"init": cfg.init}
        if cfg.init == "lstsq":
            t0 = time.time()
            gen = torch.Generator().manual_seed(cfg.seed + 1)
            pick = torch.randperm(len(self.corpus_train), generator=gen)[:cfg.init_windows]
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                tensors, tokens = fit_swiftkv_kv(self.model, self.corpus_train[pick], cfg.micro_batch)
            self.model.load_swiftkv(tensors)
            info.update(tokens=tokens, seconds=round(time.time() - t0, 1))
            if tokens < 10 * self.model.spec.hidden_size:   # each regression has hidden_size inputs
                print(f"warning: least squares fitted on only {tokens} tokens for {self.model.spec.hidden_size} "
                      "inputs per projection; raise --init-windows (the fit may not generalise)")
        elif cfg.init != "original":
            from safetensors.torch import load_file

            src = Path(cfg.init)
            files = {g: tensor_file(src, cfg.l, g) for g in cfg.groups}
            missing = [str(f) for f in files.values() if not f.is_file()]
            if missing:
                raise SystemExit(f"--init {cfg.init}: expected 'original', 'lstsq' or a run directory with "
                                 f"{', '.join(missing)}")
            self.model.load_swiftkv({g: load_file(str(f)) for g, f in files.items()})
        if cfg.init != "original":      # kept so that the starting point can be evaluated on its own
            self.export(prefix="init-")
        info["heldout_kl_T1"] = self.evaluate()
        print(f"init {cfg.init}: held-out KL(T=1) " +
              ", ".join(f"g={g} {v:.4f}" for g, v in info["heldout_kl_T1"].items()))
        with open(self.out / "init.json", "w") as f:
            json.dump(info, f, indent=2)
        return info

    # ---- one forward for all students -----------------------------------------------------
    def _forward(self, ids: torch.Tensor):
        cfg, m = self.cfg, self.model
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            h, cos, sin = m.trunk(ids)
            t_logits, t_pen = m.teacher(h, cos, sin)
            losses = []
            for g in cfg.groups:
                s_logits, s_pen = m.student(h, cos, sin, g, cfg.grad_checkpointing)
                loss = self.loss_fn(t_logits, s_logits, cfg.temperature)
                if cfg.hidden_mse:
                    loss = loss + cfg.hidden_mse * (s_pen.float() - t_pen.float()).pow(2).mean()
                losses.append(loss)
        return torch.stack(losses)

    def _targets(self, rows: torch.Tensor, ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """Cached (or now computed and stored) trunk output and teacher targets of train rows ``rows``."""
        cfg, m = self.cfg, self.model
        keys = [int(self.train_ids[r]) for r in rows]
        recs = [self.cache.get(k, ids[j]) for j, k in enumerate(keys)]
        miss = [j for j, r in enumerate(recs) if r is None]
        if miss:
            with torch.no_grad(), torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                h, cos, sin = m.trunk(ids[miss].to(self.device))
                t_logits, t_pen = m.teacher(h, cos, sin)
                tgt = teacher_targets(t_logits, cfg.topk, cfg.temperature)
            store = getattr(torch, cfg.cache_dtype)
            for n, j in enumerate(miss):
                rec = {"ids": ids[j], "h": h[n].to(store), "penult": t_pen[n].to(store),
                       **{k: v[n] for k, v in tgt.items()}}
                self.cache.put(keys[j], rec)
                recs[j] = rec
        return {k: torch.stack([r[k] for r in recs]).to(self.device) for k in recs[0] if k != "ids"}

    def _forward_cached(self, rows: torch.Tensor, ids: torch.Tensor):
        cfg, m = self.cfg, self.model
        t = self._targets(rows, ids)
        h = t["h"].float()
        cos, sin = m.positions(h.shape[1])
        losses = []
        with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
            for g in cfg.groups:
                s_logits, s_pen = m.student(h, cos, sin, g, cfg.grad_checkpointing)
                loss = topk_kl(s_logits, t["idx"], t["val"], t["lse"], cfg.temperature)
                if cfg.hidden_mse:
                    loss = loss + cfg.hidden_mse * (s_pen.float() - t["penult"].float()).pow(2).mean()
                losses.append(loss)
        return torch.stack(losses)

    # ---- state -------------------------------------------------------------------------------
    def save_state(self) -> None:
        tmp = self.out / "state.pt.tmp"
        torch.save({"config": asdict(self.cfg), "step": self.step, "tokens_seen": self.tokens_seen,
                    "elapsed": self.elapsed, "students": {g: self.model.swiftkv_state(g) for g in self.cfg.groups},
                    "optimizer": self.opt.state_dict()}, tmp)
        os.replace(tmp, self.out / "state.pt")

    def load_state(self) -> bool:
        path = self.out / "state.pt"
        if not path.exists():
            return False
        st = torch.load(path, map_location=self.device, weights_only=False)
        keep = ("l", "groups", "seq_len", "micro_batch", "grad_accum", "steps", "seed", "corpus", "init")
        for k in keep:
            was = st["config"].get(k, DistillConfig.__dataclass_fields__[k].default)
            if was != getattr(self.cfg, k):
                raise SystemExit(f"cannot resume: {k}={was!r} in {path}, {getattr(self.cfg, k)!r} now")
        self.model.load_swiftkv(st["students"])
        self.opt.load_state_dict(st["optimizer"])
        self.step, self.tokens_seen, self.elapsed = st["step"], st["tokens_seen"], st["elapsed"]
        return True

    def export(self, prefix: str = "swiftkv-") -> dict[int, Path]:
        from safetensors.torch import save_file

        paths = {}
        for g in self.cfg.groups:
            p = tensor_file(self.out, self.cfg.l, g, prefix)
            save_file({k: v.to(torch.bfloat16).contiguous().cpu() for k, v in self.model.swiftkv_state(g).items()},
                      str(p), metadata={"format": "pt", "l": str(self.cfg.l), "g": str(g), "step": str(self.step)})
            paths[g] = p
        return paths

    def _init_record(self) -> dict:
        """What ``initialise`` recorded; a run started without it began from the constructor's (papers') tensors."""
        path = self.out / "init.json"
        return json.loads(path.read_text()) if path.exists() else {"init": "original"}

    @torch.no_grad()
    def evaluate(self) -> dict[int, float]:
        """Held-out KL(teacher || student) at temperature 1, mean per token."""
        tot = torch.zeros(len(self.cfg.groups))
        n = 0
        for i in range(0, len(self.heldout), self.cfg.micro_batch):
            ids = self.heldout[i:i + self.cfg.micro_batch].to(self.device)
            m = self.model
            with torch.autocast(self.device.type, dtype=self.amp, enabled=self.amp is not None):
                h, cos, sin = m.trunk(ids)
                t_logits, _ = m.teacher(h, cos, sin)
                for j, g in enumerate(self.cfg.groups):
                    s_logits, _ = m.student(h, cos, sin, g)
                    tot[j] += self.loss_fn(t_logits, s_logits, 1.0).float().cpu() * ids.shape[0]
            n += ids.shape[0]
        return {g: float(tot[j] / max(1, n)) for j, g in enumerate(self.cfg.groups)}

    # ---- the loop ------------------------------------------------------------------------------
    def run(self) -> dict:
        from tqdm import tqdm

        cfg = self.cfg
        per_step = cfg.micro_batch * cfg.grad_accum
        gen = torch.Generator().manual_seed(cfg.seed)
        order = torch.cat([torch.randperm(len(self.train), generator=gen)
                           for _ in range(math.ceil(cfg.steps * per_step / len(self.train)))])
        log = open(self.out / "train_log.jsonl", "a")
        bar = tqdm(total=cfg.steps, initial=self.step, desc="distill", unit="step")
        t_start = time.time() - self.elapsed
        stop_at = time.time() + cfg.max_hours * 3600 if cfg.max_hours else None
        history = {}
        while self.step < cfg.steps:
            t0 = time.time()
            lr = lr_at(cfg, self.step)
            for grp in self.opt.param_groups:
                grp["lr"] = lr
            acc = torch.zeros(len(cfg.groups))
            for micro in range(cfg.grad_accum):
                idx = order[(self.step * per_step + micro * cfg.micro_batch):][:cfg.micro_batch]
                ids = self.train[idx]
                losses = self._forward_cached(idx, ids) if self.cache else self._fwd(ids.to(self.device))
                (losses.sum() / cfg.grad_accum).backward()
                acc += losses.detach().float().cpu() / cfg.grad_accum
            norms = [float(torch.nn.utils.clip_grad_norm_(self.model.parameters_of(g), cfg.clip)) for g in cfg.groups]
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            self.step += 1
            self.tokens_seen += per_step * cfg.seq_len
            dt = time.time() - t0
            rec = {"step": self.step, "lr": lr, "tokens": self.tokens_seen, "sec": round(dt, 3),
                   **{f"loss_g{g}": round(float(acc[j]), 5) for j, g in enumerate(cfg.groups)},
                   **{f"gradnorm_g{g}": round(n, 4) for g, n in zip(cfg.groups, norms)}}
            if self.cache:
                rec.update(cache_hits=self.cache.hits, cache_misses=self.cache.misses)
            if self.step % cfg.eval_every == 0 or self.step == cfg.steps:
                history = self.evaluate()
                rec.update({f"heldout_kl_g{g}": round(v, 5) for g, v in history.items()})
            log.write(json.dumps(rec) + "\n")
            log.flush()
            bar.set_postfix({**{f"kl_g{g}": f"{float(acc[j]):.3f}" for j, g in enumerate(cfg.groups)},
                             "tok/s": f"{per_step * cfg.seq_len / dt:.0f}"})
            bar.update(1)
            self.elapsed = time.time() - t_start
            if self.step % cfg.save_every == 0:
                self.save_state()
            if stop_at and time.time() > stop_at and self.step < cfg.steps:
                self.save_state()
                bar.close()
                print(f"stopped at step {self.step} (--max-hours); rerun the same command to resume")
                return {"stopped": True, "step": self.step}
        bar.close()
        self.save_state()
        final = self.evaluate()
        paths = self.export()
        run = {"command": " ".join(shlex.quote(a) for a in sys.argv), "config": asdict(cfg),
               "steps": self.step, "tokens_seen": self.tokens_seen, "hours": round(self.elapsed / 3600, 3),
               "device": str(self.device), "torch": torch.__version__,
               "hardware": f"{platform.machine()}, {os.cpu_count()} cpus, {torch.get_num_threads()} threads"
                           + (f", {torch.cuda.get_device_name()}" if self.device.type == "cuda" else ""),
               "train_windows": len(self.train), "cache": self.cache and {
                   "dir": str(self.cache.dir), "windows": self.cache.count(), "topk": cfg.topk}, "heldout_windows": len(self.heldout), "init": self._init_record(),
               "heldout_kl_T1": final, "outputs": {g: str(p) for g, p in paths.items()}}
        (self.out / "run.json").write_text(json.dumps(run, indent=2))
        try:
            from modelkit.distill_plot import plot_run

            plot_run(self.out)
        except ImportError:                  # matplotlib is in the loadtest/dev extras only
            pass
        return run
