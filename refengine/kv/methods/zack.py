"""ZACK: SVD dimensionality compression of K and V with no decompression (zack.txt §4-5).

Per cache slot and KV head, calibration (``modelkit zack-calibrate``) found two
rotations: ``R_qk`` (SVD of stacked post-RoPE queries and keys) and ``R_vo`` (SVD
of V stacked with the head's ``W_o`` slice). Serving keeps the first ``k_r`` / ``v_r``
columns:
- keys and queries are rotated and truncated after RoPE (``refengine.kv.zack_ops``);
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

Files (format version 1): ``zack.json`` = {format, format_version, num_layers,
num_kv_heads, head_dim, swiftkv: null | {num_key_value_layers, key_value_group_size},
calibration: {...}, slots: [{layers, s_qk: [[d] per head], s_vo}]};
``zack.safetensors`` = per layer ``model.layers.{i}.self_attn.zack_r_qk`` /
``zack_r_vo`` ``[kv_heads, d, d]`` (column j = j-th right singular vector), optional
``zack_r_q`` / ``zack_r_o`` (separate query / output maps of the ``whitened`` basis,
see ``refengine.kv.zack_ops``), and ``zack_s_qk`` / ``zack_s_vo`` ``[kv_heads, d]``; config ``"zack"`` = {format_version,
rotations, mode, rate, k_ranks, v_ranks} with ranks ``[layer][kv head]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from refengine.kv import zack_ranks
from refengine.kv.base import KVMethod, Options
from refengine.kv.spec import CacheSpec, GroupSpec, ModelFacts

FORMAT = "swiftserve-zack"
FORMAT_VERSION = 1
CALIBRATION_FILE = "zack.json"
ROTATIONS_FILE = "zack.safetensors"


def tensor_name(layer: int, what: str) -> str:
    """``what`` in r_qk, r_vo, s_qk, s_vo."""
    return f"model.layers.{layer}.self_attn.zack_{what}"


class ZackOptions(Options):
    rate: float | None = Field(None, ge=0.0, lt=1.0)
    mode: Literal["adaptive", "layerwise", "uniform"] | None = None
    calibration: str | None = None
    rank_multiple: int = Field(1, ge=1, le=256)


def swiftkv_layout(facts: ModelFacts) -> dict | None:
    if facts.swiftkv_layers is None:
        return None
    return {"num_key_value_layers": facts.swiftkv_layers, "key_value_group_size": facts.group_size}


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
            cal = json.loads((d / CALIBRATION_FILE).read_text())
        except (OSError, ValueError) as exc:
            return [f"cannot read {d / CALIBRATION_FILE}: {exc}"]
        if cal.get("format") != FORMAT or cal.get("format_version") != FORMAT_VERSION:
            return [f"{d / CALIBRATION_FILE} is not a {FORMAT} v{FORMAT_VERSION} calibration"]
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
            k_layer, v_layer = served.get("k_ranks"), served.get("v_ranks")
            try:
                k = np.array([k_layer[g.layers[0]] for g in slots], dtype=int)
                v = np.array([v_layer[g.layers[0]] for g in slots], dtype=int)
                same = all(k_layer[i] == k_layer[g.layers[0]] and v_layer[i] == v_layer[g.layers[0]]
                           for g in slots for i in g.layers)
            except (TypeError, IndexError, KeyError):
                return ["config.json 'zack' ranks do not match the model's layers and KV heads"]
            if k.shape != (len(slots), facts.num_kv_heads) or v.shape != k.shape or not same:
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
        return {"format_version": FORMAT_VERSION, "rotations": ROTATIONS_FILE, "calibration": CALIBRATION_FILE,
                "mode": self.mode, "rate": round(self.rate, 6), "eps": self.eps,
                "k_ranks": [list(self.k_ranks[s]) for s in slots.layer_slot],
                "v_ranks": [list(self.v_ranks[s]) for s in slots.layer_slot]}

    # ---- loading (torch) ---------------------------------------------------
    def rotations(self):
        if self._rotations is None:
            from safetensors.torch import load_file

            path = self.calibration_dir / ROTATIONS_FILE
            rot = load_file(str(path))
            for (k_ranks, _), layers in zip(zip(self.k_ranks, self.v_ranks), self._slot_layers):
                for what in ("r_qk", "r_vo"):
                    t = rot.get(tensor_name(layers[0], what))
                    if t is None or t.dim() != 3 or t.shape[0] != len(k_ranks) or t.shape[1] != t.shape[2]:
                        raise ValueError(f"{path}: {tensor_name(layers[0], what)} missing or not "
                                         "[kv_heads, head_dim, head_dim]")
            self._rotations = rot
        return self._rotations

    def weight_overrides(self, facts: ModelFacts, spec: CacheSpec, weights):
        from refengine.kv import zack_ops

        return zack_ops.fold_value_output(facts, spec, weights, self.rotations())

    def qk_transform(self, group: GroupSpec, device, dtype):
        from refengine.kv import zack_ops

        rot = self.rotations()
        m_k = rot[tensor_name(group.layers[0], "r_qk")]
        return zack_ops.ZackRotate(group, m_k, rot.get(tensor_name(group.layers[0], "r_q"), m_k), device, dtype)

    # ---- serving ---------------------------------------------------------
    def stats(self) -> dict[str, float]:
        return {"zack_rate": self.rate}
