"""The ZACK checkpoint format (version 1): its one definition, read and written by the
reference engine (``method``), ``modelkit zack-calibrate`` and the vLLM plugin alike.

No torch and no vLLM at import time (``safetensors`` is imported inside ``load_rotations``),
so the vLLM plugin's processes and the worker's start-up checks import it for free.

Files in a calibration (or ZACK model) directory:
- ``zack.json`` (``CALIBRATION_FILE``) = {format: "swiftserve-zack", format_version: 1,
  num_layers, num_kv_heads, head_dim, swiftkv: null | {num_key_value_layers,
  key_value_group_size}, calibration: {...how it was made...},
  slots: [{layers, s_qk: [[d] per head], s_vo}]} (singular values, descending, per cache slot).
- ``zack.safetensors`` (``ROTATIONS_FILE``) = for every layer i, ``tensor_name(i, what)``:
  ``r_qk`` / ``r_vo`` float32 ``[kv_heads, d, d]`` (column j = j-th right singular vector;
  layers sharing a SwiftKV/AcrossKV cache hold identical copies), optional ``r_q`` / ``r_o``
  (separate query / output maps of the ``whitened`` basis, same shape; absent = the shared
  rotation), and ``s_qk`` / ``s_vo`` ``[kv_heads, d]``.
- ``config.json`` of a servable ZACK model: a ``"zack"`` object (``served_config``) =
  {format_version, rotations, calibration, mode, rate, eps, k_ranks, v_ranks} with ranks
  ``[layer][kv head]``; ``rotations`` is relative to the model directory or absolute.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "swiftserve-zack"
FORMAT_VERSION = 1
CALIBRATION_FILE = "zack.json"
ROTATIONS_FILE = "zack.safetensors"


class FormatError(ValueError):
    """A ZACK file that does not follow this format; the message says what is wrong."""


def tensor_name(layer: int, what: str) -> str:
    """``what`` in r_qk, r_vo, r_q, r_o, s_qk, s_vo."""
    return f"model.layers.{layer}.self_attn.zack_{what}"


# ---- zack.json -----------------------------------------------------------------
def swiftkv_record(swiftkv_layers: int | None, group_size: int) -> dict | None:
    """The ``swiftkv`` field of ``zack.json``: the SwiftKV layout the calibration was made with."""
    if swiftkv_layers is None:
        return None
    return {"num_key_value_layers": swiftkv_layers, "key_value_group_size": group_size}


def read_calibration(directory: Path) -> dict:
    """``directory / zack.json``, checked to be this format and version."""
    path = Path(directory) / CALIBRATION_FILE
    try:
        cal = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise FormatError(f"cannot read {path}: {exc}") from None
    if cal.get("format") != FORMAT or cal.get("format_version") != FORMAT_VERSION:
        raise FormatError(f"{path} is not a {FORMAT} v{FORMAT_VERSION} calibration")
    return cal


# ---- config.json "zack" ----------------------------------------------------------
def served_config(mode: str, rate: float, eps: float | None, k_ranks: list, v_ranks: list,
                  rotations: str = ROTATIONS_FILE, calibration: str | None = CALIBRATION_FILE) -> dict:
    """The ``"zack"`` object of a servable model's ``config.json`` (ranks ``[layer][kv head]``);
    ``calibration=None`` leaves the field out (rotations without singular values)."""
    out = {"format_version": FORMAT_VERSION, "rotations": rotations, "calibration": calibration,
           "mode": mode, "rate": rate, "eps": eps, "k_ranks": k_ranks, "v_ranks": v_ranks}
    if calibration is None:
        del out["calibration"]
    return out


def check_version(zack: dict) -> None:
    version = zack.get("format_version")
    if version != FORMAT_VERSION:
        raise FormatError(f"ZACK format_version {version!r} is not supported (expected {FORMAT_VERSION})")


def served_ranks(zack: dict, num_layers: int, num_kv_heads: int) -> tuple[list[list[int]], list[list[int]]]:
    """(k_ranks, v_ranks) of a config ``"zack"`` object, each ``[layer][kv head]`` of ints."""
    rows = []
    for key in ("k_ranks", "v_ranks"):
        table = zack.get(key)
        if not isinstance(table, list) or len(table) != num_layers or any(
                not isinstance(r, list) or len(r) != num_kv_heads for r in table):
            raise FormatError(f"ZACK {key} must be [[rank per KV head] per layer] for {num_layers} layers "
                              f"x {num_kv_heads} KV heads")
        try:
            rows.append([[int(v) for v in r] for r in table])
        except (TypeError, ValueError):
            raise FormatError(f"ZACK {key} must hold integer ranks") from None
    return rows[0], rows[1]


def rotations_file(zack: dict) -> str:
    """The rotations file a config ``"zack"`` object names (relative to the model directory, or absolute)."""
    return str(zack.get("rotations") or ROTATIONS_FILE)


# ---- zack.safetensors ------------------------------------------------------------
def load_rotations(path: str | Path) -> dict:
    """Every tensor of a rotations file (torch tensors, by ``tensor_name``)."""
    from safetensors.torch import load_file

    return load_file(str(path))


def layer_maps(tensors: dict, layer: int, path: str | Path, kv_heads: int | None = None) -> tuple:
    """``(m_qk, m_vo, m_q, m_o)`` of one layer, each ``[kv_heads, d, d]``; ``m_q`` / ``m_o`` fall back
    to the shared rotations ``m_qk`` / ``m_vo`` when the file has no separate maps."""
    try:
        qk, vo = tensors[tensor_name(layer, "r_qk")], tensors[tensor_name(layer, "r_vo")]
    except KeyError as exc:
        raise FormatError(f"{path}: missing ZACK rotation {exc.args[0]}") from None
    if qk.dim() != 3 or qk.shape[1] != qk.shape[2] or vo.shape != qk.shape or (
            kv_heads is not None and qk.shape[0] != kv_heads):
        raise FormatError(f"{path}: layer {layer} rotations must be [kv_heads, d, d], got {tuple(qk.shape)}")
    q, o = tensors.get(tensor_name(layer, "r_q"), qk), tensors.get(tensor_name(layer, "r_o"), vo)
    if q.shape != qk.shape or o.shape != qk.shape:
        raise FormatError(f"{path}: layer {layer} query/output maps must match the rotations' shape")
    return qk, vo, q, o
