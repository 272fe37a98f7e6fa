"""A one-slot KV cache driven like the engine drives it (no model): for KV-method unit tests."""

from types import SimpleNamespace

import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv.cache import KVCache
from refengine.kv.spec import CacheSpec, EngineLimits, ModelFacts

CPU = torch.device("cpu")


class OneSlot:
    """One cache slot of ``kvh`` KV heads (``G`` query heads each) under ``methods``; one request."""

    def __init__(self, methods, kvh=2, G=2, d=8, block_size=4, num_blocks=16, dtype=torch.float32):
        facts = ModelFacts("/m", 1, kvh * G, kvh, d, torch.empty((), dtype=dtype).element_size(), None, 1,
                           block_size=block_size)
        group = CacheSpec.for_model(facts).groups[0]
        for m in methods:
            group = m.configure(group, facts)
        spec = CacheSpec((group,), (0,))
        for m in methods:
            m.reserved_bytes(spec, EngineLimits(block_size, 4, 64))
        self.methods, self.bs, self.d, self.kvh, self.G = methods, block_size, d, kvh, G
        self.kv = KVCache(spec, methods, num_blocks, block_size, dtype, CPU)
        self.slot = self.kv.slots[0]
        self.table = list(range(num_blocks - 1, -1, -1))       # blocks out of order on purpose
        self.req = SimpleNamespace(request_id="r", num_cached_tokens=0, prefilled=False, num_tokens=0,
                                   status=SimpleNamespace(finished=False))
        self.edits = []

    def step(self, q, k, v, start, scale=None, ends_prefill=False):
        """Write ``k, v [n, kvh, d]`` at cache entries start..start+n-1 and attend with ``q [n, kvh*G, d]``;
        then the methods' ``after_step`` (its edits are appended to ``self.edits``)."""
        n = k.shape[0]
        chunk = SimpleNamespace(request=self.req, cache_start=start, num_tokens=n, block_table=self.table,
                                ends_prefill=ends_prefill)
        sched = SimpleNamespace(chunks=[chunk])
        for m in self.methods:
            m.begin_step(sched, self.kv)
        spec = [(start, n, self.table)]
        self.slot.write(slot_mapping(spec, self.bs, CPU), k, v.reshape(n, -1))
        out = self.slot.attend(q, build_attn_batch(spec, self.bs, CPU, seq_ids=["r"]),
                               scale or self.d ** -0.5)
        self.req.num_cached_tokens = start + n
        for m in self.methods:
            self.edits += m.after_step(sched, self.kv)
        return out.view(n, self.kvh * self.G, -1)


def reference(q, k, v, start, scale):
    """Causal attention of queries at entries start.. over k/v [ctx, kvh, d] (GQA by repetition)."""
    n, G = q.shape[0], q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = torch.einsum("qhd,khd->hqk", q, kk) * scale
    pos = torch.arange(k.shape[0])
    s = s.masked_fill(pos.view(1, 1, -1) > (start + torch.arange(n)).view(1, -1, 1), float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
