"""FP8 KV codec: every stored K/V element as float8 e4m3 with one float32 scale per
(token, head). ``--kv-cache-dtype fp8`` selects it; so does ``{"fp8": {}}``.

Composes with SwiftKV/AcrossKV (per slot) and ZACK (it encodes the compressed
dimensions: 1 byte per kept element + 4 bytes per head). Storage is
``refengine.kv.storage.Fp8Store``; attention reads dequantised blocks.
"""

from __future__ import annotations

from refengine.kv.base import KVMethod, Options
from refengine.kv.spec import GroupSpec, ModelFacts


class Fp8Options(Options):
    pass


class Fp8Method(KVMethod):
    name = "fp8"
    role = "codec"
    OptionsModel = Fp8Options
    summary = "float8 e4m3 storage with a per-(token, head) scale (same as --kv-cache-dtype fp8)"
    # Options that keep outputs identical to the baseline (the shared tests): none for a lossy codec.
    lossless_options = None

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        return group.with_(codec="fp8", codec_owner=self.name)
