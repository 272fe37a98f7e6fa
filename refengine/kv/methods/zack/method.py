"""ZACK: SVD dimensionality compression of K and V with no decompression (zack.txt §4-5).

Per cache slot and KV head, calibration (``modelkit zack-calibrate``) found two
rotations: ``R_qk`` (SVD of stacked post-RoPE queries and keys) and ``R_vo`` (SVD
of V stacked with the head's ``W_o`` slice). Serving keeps the first ``k_r`` / ``v_r``
columns:
- keys and queries are rotated and truncated after RoPE (``refengine.kv.methods.zack.ops``);
  dot products are rotation-invariant, so attention runs on the compressed vectors
  with the model's original softmax scale;
- ``R_vo`` is folded into ``W_v`` and ``W_o`` when the weights load, so V is produced
  and stored compressed and the attention output needs no decompression;
- the slot's ``GroupSpec`` gets the per-head sizes, so the pool is sized by them and
  heads of different ranks are stored in separate dense parts (no padding).

Options: ``rate`` (fraction of K+V elements removed over the whole cache), ``mode``
(``adaptive``: one singular-value removal ratio for every head, ZACK's method;
``layerwise``: the same, with one size per cache slot, the largest of its heads' (what vLLM
serves); ``uniform``: every head keeps the same size), ``calibration`` (directory with
``zack.json`` + ``zack.safetensors``; default: the model directory), ``rank_multiple``.
A ZACK model directory (``config.json`` has a ``"zack"`` object with ranks) turns the
method on by itself; giving a ``rate`` re-plans its ranks from the stored singular values.

The files (calibration, rotations, the served ``config.json`` object) are defined in
``refengine.kv.methods.zack.format``; the tensor work is ``refengine.kv.methods.zack.ops``
(imported when the model loads: it needs torch, the planning here does not).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from refengine.kv.base import KVMethod, Options
from refengine.kv.methods.zack import format as fmt
from refengine.kv.methods.zack import ranks as zack_ranks
from refengine.kv.methods.zack.format import CALIBRATION_FILE, ROTATIONS_FILE
from refengine.kv.spec import CacheSpec, GroupSpec, ModelFacts


class ZackOptions(Options):
    rate: float | None = Field(None, ge=0.0, lt=1.0)
    mode: Literal["adaptive", "layerwise", "uniform"] | None = None
    calibration: str | None = None
    rank_multiple: int = Field(1, ge=1, le=256)


def swiftkv_layout(facts: ModelFacts) -> dict | None:
    return fmt.swiftkv_record(facts.swiftkv_layers, facts.group_size)


class ZackMethod(KVMethod):
    name = "zack"
    role = "dims"
    OptionsModel = ZackOptions
    summary = ("SVD compression of K/V dimensions with per-head adaptive ranks, no decompression; "
               "options rate, mode (adaptive|layerwise|uniform), calibration (dir), rank_multiple")

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.k_ranks: list[tuple[int, ...]] = []     # per slot, per KV head
        self.v_ranks: list[tuple[int, ...]] = []
        self.rate = 0.0
        self.eps: float | None = None
        self.mode = "adaptive"
        self.calibration_dir: Path | None = None
        self._rotations = None
        self._slot_layers: list[tuple[int, ...]] = []

    # ---- planning ----------------------------------------------------------
    def _calibration(self, facts: ModelFacts) -> tuple[Path | None, str | None]:
        d = Path(self.opts.calibration) if self.opts.calibration else Path(facts.model_dir)
        if not (d / ROTATIONS_FILE).is_file():
            where = f"calibration directory {d}" if self.opts.calibration else f"model directory {d}"
            return None, (f"no ZACK calibration ({CALIBRATION_FILE} + {ROTATIONS_FILE}) in the {where}; run "
                          "`modelkit zack-calibrate --model MODEL --output DIR` and pass "
                          "{\"zack\": {\"calibration\": \"DIR\", \"rate\": R}} (or serve DIR itself)")
        return d, None

    def validate(self, facts: ModelFacts) -> list[str]:
        d, err = self._calibration(facts)
        if err:
            return [err]
        self.calibration_dir = d
        slots = CacheSpec.for_model(facts).groups
        if not (d / CALIBRATION_FILE).is_file():
            # A ZACK model directory may carry only rotations + ranks; a rate needs the singular values.
            if self.opts.rate is not None:
                return [f"{d} has no {CALIBRATION_FILE} (singular values), so a rate cannot be planned; "
                        "serve its own ranks (no rate) or recalibrate with `modelkit zack-calibrate`"]
            try:
                return self._plan_ranks(facts, [], slots)
            except ValueError as exc:
                return [str(exc)]
        try:
            cal = fmt.read_calibration(d)
        except fmt.FormatError as exc:
            return [str(exc)]
        want = {"num_layers": facts.num_layers, "num_kv_heads": facts.num_kv_heads, "head_dim": facts.head_dim}
        bad = [f"{k}={cal.get(k)} (model: {v})" for k, v in want.items() if cal.get(k) != v]
        if bad:
            return [f"calibration in {d} is for another model: " + ", ".join(bad)]
        layout = swiftkv_layout(facts)
        if cal.get("swiftkv") != layout:
            def say(x):
                return "without SwiftKV" if x is None else (
                    f"with SwiftKV l={x['num_key_value_layers']}, g={x['key_value_group_size']}")
            return [f"calibration in {d} was made {say(cal.get('swiftkv'))} but the model is served "
                    f"{say(layout)}: calibrate the layout you serve (or toggle --no-swiftkv)"]
        cal_slots = cal.get("slots") or []
        if [tuple(s.get("layers", ())) for s in cal_slots] != [g.layers for g in slots]:
            return [f"calibration in {d} has a different cache-slot layout than the served model"]
        try:
            return self._plan_ranks(facts, cal_slots, slots)
        except ValueError as exc:
            return [str(exc)]

    def _plan_ranks(self, facts: ModelFacts, cal_slots: list[dict], slots) -> list[str]:
        d = facts.head_dim
        served = facts.config.get("zack") if Path(facts.model_dir) == self.calibration_dir else None
        if self.opts.rate is None:
            if not served:
                return ["a rate is needed (e.g. {\"zack\": {\"rate\": 0.5}}): this model directory has no "
                        "ZACK ranks of its own"]
            if self.opts.mode and self.opts.mode != served.get("mode"):
                return [f"mode {self.opts.mode!r} differs from the model's ({served.get('mode')!r}); "
                        "give a rate to re-plan the ranks"]
            try:
                k_layer, v_layer = fmt.served_ranks(served, facts.num_layers, facts.num_kv_heads)
            except fmt.FormatError:
                return ["config.json 'zack' ranks do not match the model's layers and KV heads"]
            k = np.array([k_layer[g.layers[0]] for g in slots], dtype=int)
            v = np.array([v_layer[g.layers[0]] for g in slots], dtype=int)
            same = all(k_layer[i] == k_layer[g.layers[0]] and v_layer[i] == v_layer[g.layers[0]]
                       for g in slots for i in g.layers)
            if not same:
                return ["config.json 'zack' ranks must be [layer][kv head], equal within a shared cache slot"]
            if (k < 1).any() or (v < 1).any() or (k > d).any() or (v > d).any():
                return [f"config.json 'zack' ranks must be in [1, {d}]"]
            self.mode = str(served.get("mode", "adaptive"))
            self.eps = served.get("eps")
        else:
            self.mode = self.opts.mode or "adaptive"
            if self.mode in ("adaptive", "layerwise"):
                s_qk = np.array([s["s_qk"] for s in cal_slots], dtype=np.float64)
                s_vo = np.array([s["s_vo"] for s in cal_slots], dtype=np.float64)
                k, v, self.eps = zack_ranks.adaptive(s_qk, s_vo, self.opts.rate, self.opts.rank_multiple,
                                                     per_slot=self.mode == "layerwise")
            else:
                k, v = zack_ranks.uniform((len(slots), facts.num_kv_heads), d, self.opts.rate,
                                          self.opts.rank_multiple)
        self._slot_layers = [g.layers for g in slots]
        self.k_ranks = [tuple(int(x) for x in row) for row in k]
        self.v_ranks = [tuple(int(x) for x in row) for row in v]
        self.rate = zack_ranks.overall_rate(k, v, d)
        return []

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        if not self.k_ranks:
            raise ValueError("zack: validate() must run before configure()")
        return group.with_(k_dims=self.k_ranks[group.slot], v_dims=self.v_ranks[group.slot])

    def served_config(self, facts: ModelFacts) -> dict:
        """The ``"zack"`` object of a servable ZACK model directory with these ranks."""
        slots = CacheSpec.for_model(facts)
        return fmt.served_config(self.mode, round(self.rate, 6), self.eps,
                                 [list(self.k_ranks[s]) for s in slots.layer_slot],
                                 [list(self.v_ranks[s]) for s in slots.layer_slot])

    # ---- loading (torch) ---------------------------------------------------
    def rotations(self):
        if self._rotations is None:
            path = self.calibration_dir / ROTATIONS_FILE
            rot = fmt.load_rotations(path)
            for k_ranks, layers in zip(self.k_ranks, self._slot_layers):
                fmt.layer_maps(rot, layers[0], path, len(k_ranks))     # raises on a malformed file
            self._rotations = rot
        return self._rotations

    def weight_overrides(self, facts: ModelFacts, spec: CacheSpec, weights):
        from refengine.kv.methods.zack import ops     # torch: only when the model loads

        return ops.fold_value_output(facts, spec, weights, self.rotations())

    def qk_transform(self, group: GroupSpec, device, dtype):
        from refengine.kv.methods.zack import ops

        path = self.calibration_dir / ROTATIONS_FILE
        m_k, _, m_q, _ = fmt.layer_maps(self.rotations(), group.layers[0], path)
        return ops.ZackRotate(group, m_k, m_q, device, dtype)

    # ---- serving ---------------------------------------------------------
    def stats(self) -> dict[str, float]:
        return {"zack_rate": self.rate}
