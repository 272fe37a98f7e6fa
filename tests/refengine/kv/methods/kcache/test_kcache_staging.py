"""KCache's CUDA staging bookkeeping, run on CPU (issue 32, item 5): ``HostStore`` in staged mode
with synchronous copies. Writes go through two reusable staging buffers (no allocation per write)
and land in the host pool before any read that needs them; when a layer attends, the next host-V
layer's prefill blocks are prefetched (in layer order), and its gather takes the prefetched blocks
patched with the rows it wrote since, giving exactly what the unstaged store gives. The CUDA
streams, pinned memory and the overlap itself are untested (no GPU)."""

import torch

from refengine.attention import build_attn_batch, slot_mapping
from refengine.kv.cache import KVCache
from refengine.kv.methods.kcache.staging import StagingRing
from refengine.kv.methods.kcache.ops import HostStore
from refengine.kv.methods.kcache.method import KCacheMethod
from refengine.kv.spec import CacheSpec, ModelFacts
from refengine.kv.storage import DenseStore

CPU = torch.device("cpu")
LAYERS, KVH, G, D, BS = 3, 2, 2, 8, 4


def test_ring_reuses_its_buffers_and_releases_oldest_first():
    ring, log = StagingRing(2), []
    for i in range(20):
        slot, (a, b) = ring.acquire(((5, 3), torch.float32), ((5,), torch.int64))
        assert a.shape == (5, 3) and b.shape == (5,) and a.data_ptr() % 64 == 0 and b.data_ptr() % 64 == 0
        assert not (a.data_ptr() <= b.data_ptr() < a.data_ptr() + a.nbytes)          # views do not overlap
        ring.hold(slot, lambda i=i: log.append(i))
        assert ring.in_flight <= 2
    assert ring.allocations == 2 and log == list(range(18))      # each reuse landed the older copy first
    ring.acquire(((100, 3), torch.float32))                       # larger: that slot regrows once
    assert ring.allocations == 3 and log == list(range(19))
    ring.release_all()
    assert log == list(range(20)) and ring.in_flight == 0


def staged_store(blocks=8):
    s = HostStore(DenseStore(blocks, BS, KVH, D, torch.float32, CPU))
    s.staged = True
    return s


def test_staged_writes_allocate_nothing_per_write_and_land_before_reads():
    torch.manual_seed(0)
    s, ref = staged_store(), DenseStore(8, BS, KVH, D, torch.float32, CPU)
    for t in range(30):
        slots, x = torch.tensor([t % 32]), torch.randn(1, KVH, D)
        s.write(slots, x)
        ref.write(slots, x)
        assert s.writes.in_flight >= 1                             # deferred: not yet in the pool
    assert s.writes.allocations == 2
    assert torch.equal(s.pick(torch.tensor([5, 29]), torch.tensor([0, 1])), ref.pick(torch.tensor([5, 29]),
                                                                                      torch.tensor([0, 1])))
    assert s.writes.in_flight == 0
    assert torch.equal(s.gather(torch.tensor([7, 1])), ref.gather(torch.tensor([7, 1])))


def cache(staged: bool) -> KVCache:
    facts = ModelFacts("/m", LAYERS, KVH * G, KVH, D, 4, None, 1, block_size=BS)
    method = KCacheMethod({"top_n": 64, "device_layers": 1})
    spec = CacheSpec.for_model(facts)
    spec = CacheSpec(tuple(method.configure(g, facts) if method.applies_to(g) else g for g in spec.groups),
                     spec.layer_slot)
    kv = KVCache(spec, [method], 16, BS, torch.float32, CPU)
    for slot in kv.slots:
        for p in slot.parts:
            if isinstance(p.v, HostStore):
                p.v.staged = staged
    return kv


def run(kv, steps, data, log=None):
    """Every layer writes then attends, layer by layer, like the model; outputs per step and layer."""
    table, outs = [3, 9, 0, 12, 5, 7], []
    if log is not None:
        for i, slot in enumerate(kv.layers):
            op = slot.ops[0]
            slot.ops[0] = lambda q, p, b, s, op=op, i=i: (log.append(("attend", i)), op(q, p, b, s))[1]
            for p in slot.parts:
                if isinstance(p.v, HostStore):
                    pre = p.v.prefetch
                    p.v.prefetch = lambda seqs, pre=pre, i=i: (log.append(("prefetch", i)), pre(seqs))[1]
    for start, n in steps:
        batch = build_attn_batch([(start, n, table)], BS, CPU, seq_ids=["r"])
        slots = slot_mapping([(start, n, table)], BS, CPU)
        for i, slot in enumerate(kv.layers):
            q, k, v = (x[i, start:start + n] for x in data)
            slot.write(slots, k, v.reshape(n, -1))
            outs.append(slot.attend(q, batch, D ** -0.5))
    return outs


def test_next_layer_prefetched_in_order_and_outputs_equal_the_unstaged_store():
    torch.manual_seed(1)
    T = 21
    data = (torch.randn(LAYERS, T, KVH * G, D), torch.randn(LAYERS, T, KVH, D), torch.randn(LAYERS, T, KVH, D))
    steps = [(0, 11), (11, 9), (20, 1)]                 # a prompt in two chunks (a cached prefix), then a decode
    log = []
    staged, plain = cache(True), cache(False)
    got, want = run(staged, steps, data, log), run(plain, steps, data)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    # prefill steps: layer i's slot starts layer i+1's V fetch before its own attention runs
    prefill = [("prefetch", 1), ("attend", 0), ("prefetch", 2), ("attend", 1), ("attend", 2)]
    assert log[:10] == prefill * 2
    stores = [p.v for s in staged.slots for p in s.parts if isinstance(p.v, HostStore)]
    assert len(stores) == 2 and all(s.prefetch_hits == 2 for s in stores)      # both prefills took them
    assert all((s.prefetches, s.prefetched_blocks) == (2, 3 + 5) for s in stores)   # blocks of 11, then 20 entries
    assert all(s.writes.allocations <= 2 and s.fetches.allocations <= 2 for s in stores)
    assert not any(isinstance(p.v, HostStore) for p in staged.slots[0].parts)  # layer 0 keeps V on the device
