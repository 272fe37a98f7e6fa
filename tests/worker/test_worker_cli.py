"""The worker CLI: flags -> WorkerConfig / EngineConfig, --help, bad model, and
``python -m worker``; plus the protocol helpers the handlers rely on."""

import subprocess
import sys

import pytest

from worker.api.base_request import INT64_MAX, INT64_MIN
from worker.api.chat.protocol import ChatCompletionRequest
from worker.api.sampling import child_seed, to_sampling_params
from worker.args import build_parser, config_from_args
from worker.cli import main
from worker.errors import APIError

pytestmark = pytest.mark.e2e


def cfg(*argv):
    return config_from_args(build_parser().parse_args(list(argv)), model_dir="/m/SmolLM2")


def test_defaults():
    c = cfg()
    assert (c.host, c.port, c.engine, c.model_name, c.max_concurrent_requests) == ("127.0.0.1", 8000, "reference",
                                                                                   "SmolLM2", 0)
    e = c.engine_config
    assert (e.model, e.block_size, e.kv_cache_dtype, e.swiftkv, e.kv_methods) == ("/m/SmolLM2", 16, "auto", True, {})


def test_every_engine_flag_reaches_the_engine_config():
    c = cfg("--served-model-name", "a", "b", "--host", "0.0.0.0", "--port", "9000", "--max-model-len", "1024",
            "--block-size", "32", "--num-kv-blocks", "77", "--kv-cache-memory-gb", "2.5", "--max-num-seqs", "8",
            "--max-num-batched-tokens", "512", "--kv-cache-dtype", "fp8", "--device", "cpu", "--dtype", "bfloat16",
            "--seed", "5", "--no-swiftkv", "--torch-threads", "3", "--kv-methods", '{"zack": {"rate": 0.5}}',
            "--max-concurrent-requests", "10", "--overload-status", "503", "--tokenizer", "/t",
            "--log-level", "warning", "--packed-linear", "lm_head", "--decode-kernel", "torch",
            "--prefill-kernel", "cpp", "--fused-ops", "torch", "--engine-core", "thread", "--no-malloc-tuning",
            "--no-huge-pages", "--kv-host-memory-gb", "0.75", "--load-format", "dummy")
    e = c.engine_config
    assert c.model_names == ("a", "b") and c.model_name == "a"
    assert (c.host, c.port, c.max_concurrent_requests, c.overload_status) == ("0.0.0.0", 9000, 10, 503)
    assert (c.tokenizer_path, c.log_level) == ("/t", "warning")
    assert (e.max_model_len, e.block_size, e.num_kv_blocks, e.kv_cache_memory_gb) == (1024, 32, 77, 2.5)
    assert (e.max_num_seqs, e.max_num_batched_tokens, e.kv_cache_dtype) == (8, 512, "fp8_e4m3")
    assert (e.device, e.dtype, e.seed, e.swiftkv, e.torch_threads) == ("cpu", "bfloat16", 5, False, 3)
    assert e.kv_methods == {"zack": {"rate": 0.5}}
    assert (e.packed_linear, cfg().engine_config.packed_linear) == ("lm_head", "auto")
    assert (e.decode_kernel, cfg().engine_config.decode_kernel) == ("torch", "auto")
    assert (e.prefill_kernel, cfg().engine_config.prefill_kernel) == ("cpp", "auto")
    assert (e.fused_ops, cfg().engine_config.fused_ops) == ("torch", "auto")
    assert (e.malloc_tuning, cfg().engine_config.malloc_tuning) == (False, True)
    assert (e.huge_pages, cfg().engine_config.huge_pages) == (False, True)
    assert (e.kv_host_memory_gb, cfg().engine_config.kv_host_memory_gb) == (0.75, None)
    assert (c.engine_core, cfg().engine_core) == ("thread", "process")
    assert (e.load_format, cfg().engine_config.load_format) == ("dummy", "auto")


def test_engine_core_default_from_the_environment(monkeypatch):
    monkeypatch.setenv("SWIFTSERVE_ENGINE_CORE", "thread")
    assert cfg().engine_core == "thread" and cfg("--engine-core", "process").engine_core == "process"
    monkeypatch.setenv("SWIFTSERVE_ENGINE_CORE", "fork")
    with pytest.raises(ValueError, match="engine_core"):
        cfg()


@pytest.mark.parametrize("argv", [["--kv-methods", "[1]"], ["--kv-methods", "{bad"], ["--engine", "magic"],
                                  ["--overload-status", "500"], ["--port", "0"], ["--max-model-len", "1"],
                                  ["--packed-linear", "fast"], ["--engine", "vllm", "--packed-linear", "all"],
                                  ["--decode-kernel", "triton"], ["--engine", "vllm", "--decode-kernel", "cpp"],
                                  ["--prefill-kernel", "x"], ["--engine", "vllm", "--prefill-kernel", "torch"],
                                  ["--fused-ops", "x"], ["--engine", "vllm", "--fused-ops", "cpp"],
                                  ["--engine", "vllm", "--no-malloc-tuning"], ["--engine", "vllm", "--no-huge-pages"],
                                  ["--engine-core", "fork"], ["--engine", "vllm", "--engine-core", "process"],
                                  ["--kv-host-memory-gb", "0"], ["--engine", "vllm", "--kv-host-memory-gb", "1"],
                                  ["--load-format", "safetensors"]])
def test_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + ["--model", "/nonexistent"])
    assert e.value.code == 2


def test_unknown_model_is_a_message_not_a_traceback(capsys):
    assert main(["--model", "/nonexistent/dir"]) == 2
    assert "cannot use model" in capsys.readouterr().err


def test_python_m_worker_help():
    r = subprocess.run([sys.executable, "-m", "worker", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for flag in ("--model", "--served-model-name", "--max-model-len", "--kv-cache-dtype", "--no-swiftkv",
                 "--engine", "--max-concurrent-requests", "--torch-threads"):
        assert flag in r.stdout


def test_child_seeds_are_distinct_and_stay_int64():
    assert child_seed(None, 3) is None
    assert [child_seed(10, i) for i in range(3)] == [10, 11, 12]
    assert child_seed(INT64_MAX, 1) == INT64_MIN


def test_to_sampling_params_context_rules():
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}])
    assert to_sampling_params(req, prompt_len=10, max_model_len=100, vocab_size=50).max_tokens == 90
    with pytest.raises(APIError) as e:
        to_sampling_params(req, prompt_len=100, max_model_len=100, vocab_size=50)
    assert e.value.status == 400 and "100" in e.value.message
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_tokens=91)
    with pytest.raises(APIError):
        to_sampling_params(req, prompt_len=10, max_model_len=100, vocab_size=50)


@pytest.mark.model
def test_load_format_dummy_serves_a_directory_without_weights(smollm2_dir, tmp_path):
    """``--load-format dummy``: random weights shaped by config.json; a directory with only the
    config and the tokenizer (what benchmarks/lib/model_shapes.py writes) serves a completion."""
    import shutil

    from fastapi.testclient import TestClient
    from transformers import AutoTokenizer

    from refengine.engine import LLMEngine
    from worker.app import build_app
    from worker.backends import create_engine_client
    from worker.cli import checked_config

    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(smollm2_dir / f, tmp_path / f)
    argv = ["--model", str(tmp_path), "--served-model-name", "smol", "--max-model-len", "256", "--num-kv-blocks",
            "32", "--engine-core", "thread", "--torch-threads", "1"]
    config, reason = checked_config(build_parser().parse_args(argv + ["--load-format", "dummy"]))
    assert reason is None and config.engine_config.load_format == "dummy"
    app = build_app(config, create_engine_client(config), AutoTokenizer.from_pretrained(tmp_path))
    with TestClient(app) as client:
        r = client.post("/v1/completions", json={"model": "smol", "prompt": "Hi", "max_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    # the default (auto) wants the weights: the same directory cannot load without them
    auto, _ = checked_config(build_parser().parse_args(argv))
    with pytest.raises(Exception, match="safetensors"):
        LLMEngine(auto.engine_config)


@pytest.mark.slow
@pytest.mark.model
def test_python_m_worker_serves_and_stops_cleanly(smollm2_dir):
    import signal
    import time

    import httpx
    import psutil
    from benchmarks.lib.procs import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "worker", "--model", str(smollm2_dir), "--port", str(port),
                             "--served-model-name", "smol", "--max-model-len", "256", "--num-kv-blocks", "32",
                             "--torch-threads", "1", "--log-level", "warning"])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, "worker exited during start-up"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.5)
        r = httpx.post(url + "/v1/completions", json={"model": "smol", "prompt": "Hi", "max_tokens": 3}, timeout=120)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # the engine core runs in a child process (--engine-core process, the default)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert any("multiprocessing" in " ".join(c.cmdline()) for c in children)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    # uvicorn shuts down gracefully, then re-raises SIGTERM so the exit status reports the signal.
    assert code in (0, -signal.SIGTERM)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE], "engine process outlived the worker"


@pytest.mark.parametrize("methods, words", [
    ('{"bogus": {}}', "unknown KV method 'bogus'"),
    ('{"zack": {"rate": 1.5}}', "zack.rate"),
    ('{"zack": {"rate": 0.5}, "fp8": 3}', "fp8: options must be a JSON object"),
])
def test_bad_kv_methods_are_refused_before_the_model_is_resolved(methods, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--model", "/nonexistent", "--kv-methods", methods])
    assert e.value.code == 2 and words in capsys.readouterr().err


@pytest.mark.model
def test_kv_methods_the_model_cannot_serve_are_refused_before_it_loads(smollm2_dir, capsys):
    # The default model has no ZACK calibration: a message naming the fix, no model load, no traceback.
    assert main(["--model", str(smollm2_dir), "--kv-methods", '{"zack": {"rate": 0.5}}']) == 2
    err = capsys.readouterr().err
    assert "no ZACK calibration" in err and "modelkit zack-calibrate" in err and "Traceback" not in err


@pytest.mark.model
@pytest.mark.parametrize("argv, words", [
    # Every engine input reaches the one check (the block size used to be left out: the CLI passed it,
    # the engine refused it after start).
    (["--block-size", "512", "--kv-methods", '{"zipcache": {}}'], "block_size 512 > 256"),
    (["--kv-cache-dtype", "fp8", "--kv-methods", '{"zipcache": {}}'], "two KV codecs cannot be combined"),
])
def test_kv_settings_are_checked_with_every_engine_input_before_it_starts(smollm2_dir, argv, words, capsys):
    from worker.cli import preflight

    assert main(["--model", str(smollm2_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert "--kv-methods: " in err and words in err and "Traceback" not in err
    assert words in preflight(["--model", str(smollm2_dir), *argv])


@pytest.mark.parametrize("argv, words", [
    (["--tensor-parallel-size", "2"], "--tensor-parallel-size is a vLLM-engine option"),
    (["--pipeline-parallel-size", "2"], "--pipeline-parallel-size is a vLLM-engine option"),
    (["--no-kv-sharing-fast-prefill"], "--kv-sharing-fast-prefill is a vLLM-engine option"),
    (["--engine", "vllm", "--tensor-parallel-size", "0"], "must be >= 1"),
    (["--cpu-affinity", "0-x"], "not a CPU list"),
    (["--cpu-affinity", "100000"], "not all available"),
])
def test_parallelism_and_affinity_flags_are_checked(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv + ["--model", "/nonexistent"])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_enforce_eager_turns_the_reference_engines_cuda_graphs_off():
    assert cfg().engine_config.cuda_graphs is True
    assert cfg("--enforce-eager").engine_config.cuda_graphs is False


def test_vllm_flags_reach_the_worker_config():
    c = cfg("--engine", "vllm", "-tp", "2", "--pipeline-parallel-size", "2", "--no-kv-sharing-fast-prefill",
            "--no-enforce-eager")
    assert (c.tensor_parallel_size, c.pipeline_parallel_size, c.vllm_fast_prefill, c.vllm_enforce_eager) == \
        (2, 2, False, False)


@pytest.mark.model
@pytest.mark.parametrize("methods, words", [
    ('{"kcache": {}}', "kcache: not available with --engine vllm"),
    ('{"zack": {"rate": 0.5}}', "no ZACK calibration"),
])
def test_kv_methods_vllm_cannot_do_are_refused_before_vllm_starts(smollm2_dir, methods, words, capsys):
    # No vLLM needed: the worker checks the translation before importing it.
    assert main(["--engine", "vllm", "--model", str(smollm2_dir), "--kv-methods", methods]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


@pytest.mark.model
def test_preflight_is_what_swiftserve_up_runs_before_starting_workers(smollm2_dir):
    from worker.cli import preflight

    assert preflight(["--model", str(smollm2_dir)]) is None
    assert "no ZACK calibration" in preflight(["--model", str(smollm2_dir), "--kv-methods", '{"zack": {"rate": 0.5}}'])
    assert "kcache: not available" in preflight(["--model", str(smollm2_dir), "--engine", "vllm",
                                                 "--kv-methods", '{"kcache": {}}'])
    assert "invalid worker arguments" in preflight(["--model", str(smollm2_dir), "--tensor-parallel-size", "2"])
