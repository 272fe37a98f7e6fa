"""KCache: V in a separate host pool not counted in the device pool; decode keeps the top-N
probabilities per query head and fetches only those V rows; nothing dropped = full attention."""

import torch
from kv_slot_support import OneSlot, reference

from refengine.kv.methods.kcache.ops import HostStore
from refengine.kv.methods.kcache.method import KCacheMethod
from refengine.kv.storage import DenseStore


def _slot(top_n, renormalize=True):
    return OneSlot([KCacheMethod({"top_n": top_n, "device_layers": 0, "renormalize": renormalize})])


def _data(T=14, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, h, 8, generator=g) * 2 for h in (4, 2, 2))


def nbytes(store) -> int:
    return sum(t.numel() * t.element_size() for t in vars(getattr(store, "inner", store)).values()
               if torch.is_tensor(t))


def test_v_lives_in_a_host_pool_the_device_pool_does_not_count():
    """Fails if V were kept in the device pool: the device pool's allocated tensors are K's alone
    (their bytes are the device total, with no V-wide tensor among them), V's rows are written into
    the host store's own tensor, and the bytes per token the pool is sized by exclude V."""
    s = _slot(8)
    part = s.slot.parts[0]
    assert s.slot.group.v_on_host and part.v.device.type == "cpu"
    assert isinstance(part.v, HostStore) and isinstance(part.k, DenseStore)
    # what is really allocated: device pool = K's tensors only; host = V's
    assert nbytes(part.k) == s.kv.bytes_total == s.kv.bytes_per_block * s.kv.num_blocks
    assert nbytes(part.v) == s.kv.host_bytes_total == s.kv.host_bytes_per_block * s.kv.num_blocks > 0
    assert all(t.shape[-1] == s.d for t in vars(part.k).values() if torch.is_tensor(t) and t.dim() == 4)
    assert s.kv.bytes_per_block == part.k.bytes_per_block                  # device: K only
    assert s.kv.spec.device_bytes_per_token == s.kvh * s.d * 4             # fp32 K bytes of this one layer
    assert s.kv.spec.host_bytes_per_token == s.kvh * s.d * 4               # and V's, on the host
    assert s.kv.host_bytes_per_block == part.v.bytes_per_block > 0
    assert s.kv.spec.device_bytes_per_block == s.kv.bytes_per_block
    assert s.kv.spec.host_bytes_per_block == s.kv.host_bytes_per_block
    # V written through the slot lands in the host store's tensor, not in any device-pool tensor
    q, k, v = _data(T=6, seed=3)
    s.step(q, k, v, 0)
    flat = part.v.inner.data.view(-1, s.kvh, s.d)
    rows = [s.table[t // s.bs] * s.bs + t % s.bs for t in range(6)]
    assert torch.equal(flat[rows], v)
    assert not any(torch.equal(t.view(-1, s.kvh, s.d)[rows], v) for t in vars(part.k).values() if torch.is_tensor(t))


def test_top_n_at_least_the_context_is_full_attention():
    q, k, v = _data()
    s = _slot(64)
    s.step(q[:10], k[:10], v[:10], 0)
    for i in range(10, 14):
        out = s.step(q[i:i + 1], k[i:i + 1], v[i:i + 1], i)
        assert torch.allclose(out, reference(q[i:i + 1], k[:i + 1], v[:i + 1], i, 8 ** -0.5), atol=1e-5)


def test_decode_keeps_the_top_n_rows_per_query_head_and_fetches_only_them():
    q, k, v = _data(seed=1)
    for renorm in (True, False):
        s = _slot(3, renorm)
        s.step(q[:13], k[:13], v[:13], 0)
        counters = s.methods[0].counters
        before = counters["kcache_v_rows_fetched"]
        out = s.step(q[13:14], k[13:14], v[13:14], 13)[0]                   # [4 query heads, 8]
        assert counters["kcache_v_rows_fetched"] - before == 4 * 3          # N rows per query head
        for h in range(4):
            p = (q[13, h] @ k[:14, h // 2].T * 8 ** -0.5).softmax(-1)
            top = p.topk(3)
            w = top.values / top.values.sum() if renorm else top.values
            assert torch.allclose(out[h], w @ v[top.indices, h // 2], atol=1e-5)
