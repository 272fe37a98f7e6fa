"""A worker started with ``--kv-methods`` KCache, ZipCache or eviction (and ZACK x ZipCache) serves
completions and reports in /metrics what the method really stores: device and host KV bytes per
token, the pool's host allocation, and the method's own gauges (rows fetched, blocks quantised,
tokens evicted)."""

import httpx
import pytest
from worker_test_fakes import ServerThread

from refengine.config import EngineConfig

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

BASELINE = 46080.0            # SmolLM2 fp32 KV bytes per token (30 layers x 3 KV heads x 64 x K,V x 4 B)
PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 12)      # > 64 tokens: eviction acts


def metrics(url: str) -> dict[str, float]:
    return {line.split("{")[0].split(" ")[0].removeprefix("swiftserve_worker_"): float(line.rsplit(" ", 1)[1])
            for line in httpx.get(url + "/metrics").text.splitlines() if line.startswith("swiftserve_worker_")}


def serve(model_dir, methods: dict, **engine) -> dict[str, float]:
    from transformers import AutoTokenizer

    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.config import WorkerConfig

    config = WorkerConfig(engine_config=EngineConfig(model=str(model_dir), max_model_len=512, num_kv_blocks=64,
                                                     kv_methods=methods, **engine), served_model_name=("smol",))
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(model_dir))
    with ServerThread(app, startup_timeout=600) as srv:
        r = httpx.post(srv.url + "/v1/completions", timeout=300,
                       json={"model": "smol", "prompt": PROMPT, "max_tokens": 24, "temperature": 0,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 24
        return metrics(srv.url)


def test_kcache_moves_v_to_the_host_and_fetches_top_n_rows(smollm2_dir):
    # --kv-host-memory-gb bounds the host pool: 40 of the 64 blocks' host V fit (512 tokens need 32)
    host_per_block = BASELINE * 28 / 60 * 16
    bound = 40.5 * host_per_block / 2 ** 30
    m = serve(smollm2_dir, {"kcache": {"top_n": 16, "device_layers": 2}}, kv_host_memory_gb=bound)
    # device: K of every layer + V of layers 0-1; host: V of layers 2-29; reported apart
    assert m["kv_bytes_per_token"] == BASELINE * (30 + 2) / 60
    assert m["kv_host_bytes_per_token"] == BASELINE * 28 / 60
    assert m["kv_blocks_total"] == 40 and m["kv_host_bytes_limit"] == int(bound * 2 ** 30)
    assert m["kv_host_bytes_total"] == 40 * host_per_block <= m["kv_host_bytes_limit"]
    assert m["kv_bytes_total"] == 40 * 16 * m["kv_bytes_per_token"]
    # 23 decode steps (the first token comes from the prefill) x 28 host-V layers, each fetching
    # N rows per query head (9 query heads)
    assert m["kcache_top_n"] == 16 and m["kcache_decode_rows"] == 23 * 28
    assert m["kcache_v_rows_fetched"] == m["kcache_decode_rows"] * 9 * 16


def test_zipcache_packs_the_pool(smollm2_dir):
    m = serve(smollm2_dir, {"zipcache": {"window": 16}})
    assert m["kv_block_size"] == 32                    # ZipCache's default block size when none is given
    assert m["kv_bytes_per_token"] < BASELINE / 6 and m["kv_reserved_bytes"] > 0
    # ~144 tokens, window 16: the blocks of tokens 0-95 have left the window and were quantised
    assert m["zipcache_blocks_flushed"] >= 3 and m["zipcache_probe_queries"] > 0, m


def test_eviction_frees_blocks_after_the_prompt(smollm2_dir):
    m = serve(smollm2_dir, {"eviction": {"budget": 32, "window": 8}})
    assert m["eviction_requests"] == 1 and m["eviction_tokens_evicted"] > 64 and m["eviction_blocks_freed"] >= 4
    assert m["kv_bytes_per_token"] == BASELINE


def test_zack_with_zipcache(smollm2_dir, zack_dir):
    m = serve(zack_dir, {"zipcache": {"window": 16}})        # the ZACK model directory turns ZACK on itself
    plain = serve(smollm2_dir, {"zipcache": {"window": 16}})
    assert m["zack_rate"] >= 0.5 and m["kv_bytes_per_token"] < 0.7 * plain["kv_bytes_per_token"]
