"""KCache (kcache.txt): K on the device, V of the later layers in host memory, top-N V recall.

Planning: every cache slot whose layers are all ``>= device_layers`` (the paper's L)
gets ``v_on_host``: its V stores are allocated in a host pool (pinned when the device
is CUDA; on CPU a separate allocation), which the device pool's budget does not count.
Slots of layers ``< L`` keep V on the device. With SwiftKV a slot shared by an AcrossKV
group moves as one (its first layer decides).

Serving (``refengine.kv.methods.kcache.ops``):
- prefill attention is unchanged (full softmax over every cached token; V is read
  back from the host pool). On CUDA the V written is pushed to the host through two
  reusable pinned staging buffers, and a prefill's V blocks of the next host-V layer are
  fetched while the current layer computes (``refengine.kv.methods.kcache.ops.HostStore``; the
  CUDA timing is untested);
- decode computes softmax(QK^T) over all cached keys on the device, keeps the
  ``top_n`` largest probabilities per query head, fetches only those N V rows from the
  host and finishes attention with them. ``renormalize`` (default true) divides the kept
  probabilities by their sum, so the output stays a convex combination of V rows (the
  paper's TopN(softmax) without renormalisation is ``renormalize: false``). With
  ``top_n >=`` the context nothing is dropped and decode equals full attention.

Options: ``top_n`` (N), ``device_layers`` (L), ``renormalize``. The host pool is bounded by
``EngineConfig.kv_host_memory_gb`` (``--kv-host-memory-gb``; the pool gets the blocks both
budgets allow, ``refengine.block_groups.cap_by_host``). ``/metrics`` shows the
device and host KV bytes (``kv_bytes_*``, ``kv_host_bytes_*``, ``kv_host_bytes_limit``) and ``kcache_*`` gauges
(N, L, V rows fetched from the host, decode rows served: one per sequence per host-V layer).
"""

from __future__ import annotations

from pydantic import Field

from refengine.kv.base import KVMethod, Options
from refengine.kv.spec import CacheSpec, GroupSpec, ModelFacts


class KCacheOptions(Options):
    top_n: int = Field(64, ge=1)
    device_layers: int = Field(2, ge=0)
    renormalize: bool = True


class KCacheMethod(KVMethod):
    name = "kcache"
    role = "placement"
    OptionsModel = KCacheOptions
    summary = ("V of layers >= device_layers in a host pool, decode attends to the top_n V rows per head "
               "fetched from the host; options top_n, device_layers, renormalize")
    refuses = {"zipcache": "KCache's top-N decode fetches dense V rows from the host pool, ZipCache packs V per "
                           "block with its own attention: combining them is not implemented"}

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.counters = {"kcache_v_rows_fetched": 0.0, "kcache_decode_rows": 0.0}

    def validate(self, facts: ModelFacts) -> list[str]:
        L = self.opts.device_layers
        if L >= facts.num_layers:
            return [f"device_layers={L} keeps every layer's V on the device (the model has {facts.num_layers} "
                    "layers): nothing would move to the host"]
        if not any(min(g.layers) >= L for g in CacheSpec.for_model(facts).groups):
            return [f"no cache slot has all its layers >= device_layers={L}"]
        return []

    def applies_to(self, group: GroupSpec) -> bool:
        return min(group.layers) >= self.opts.device_layers

    def configure(self, group: GroupSpec, facts: ModelFacts) -> GroupSpec:
        return group.with_(v_on_host=True)

    def make_store(self, group, which, heads, dims, num_blocks, block_size, dtype, device, pin=False):
        if which != "v" or not group.v_on_host:
            return None
        from refengine.kv.methods.kcache.ops import HostStore
        from refengine.kv.storage import make_store

        # pin: the engine's device is CUDA (its current device computes; the host copies are staged)
        return HostStore(make_store(group.codec, num_blocks, block_size, heads, dims, dtype, device, pin),
                         "cuda" if pin else "cpu")

    def wrap_attention(self, group: GroupSpec, op):
        from refengine.kv.methods.kcache.ops import TopNAttention

        return TopNAttention(op, self.opts.top_n, self.opts.renormalize, self.counters)

    def stats(self) -> dict[str, float]:
        return {"kcache_top_n": float(self.opts.top_n), "kcache_device_layers": float(self.opts.device_layers),
                **self.counters}
