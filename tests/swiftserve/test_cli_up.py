"""``swiftserve up``'s steps without starting a stack: argument checks, the workers' KV check
before any process starts (with every engine input), and the command lines it plans."""

import json
import sys
from types import SimpleNamespace

import pytest

from swiftserve import cli


def test_bad_kv_methods_and_numbers_stop_up_before_the_model(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["up", "--kv-methods", "{bad"])
    assert e.value.code == 2 and "--kv-methods: not valid JSON" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        cli.main(["up", "--kv-methods", '{"bogus": {}}'])
    assert e.value.code == 2 and "unknown KV method 'bogus'" in capsys.readouterr().err
    assert cli.main(["up", "--workers", "0"]) == 2
    assert "--workers must be >= 1" in capsys.readouterr().err


@pytest.mark.model
@pytest.mark.parametrize("argv, words", [
    # Every worker argument reaches the engine's own check (the block size used to be left out: up
    # started the workers and their engines refused it).
    (["--kv-methods", '{"zipcache": {}}', "--worker-arg=--block-size=512"], "block_size 512 > 256"),
    (["--kv-methods", '{"zipcache": {}}', "--worker-arg=--kv-cache-dtype=fp8"], "two KV codecs cannot be combined"),
])
def test_a_kv_setting_the_engine_refuses_fails_in_up_before_any_process(smollm2_dir, argv, words, capsys,
                                                                        monkeypatch):
    monkeypatch.setattr(cli.StackRun, "run", lambda self: pytest.fail("a process was started"))
    assert cli.main(["up", "--model", str(smollm2_dir), *argv]) == 2
    err = capsys.readouterr().err
    assert "workers cannot start: --kv-methods:" in err and words in err and "Traceback" not in err


def _args(**kw):
    base = dict(workers=2, worker_base_port=8100, host="127.0.0.1", port=8000, served_model_name=None,
                drain_timeout=30.0, policy=None, kv_methods=None, worker_arg=[])
    return SimpleNamespace(**{**base, **kw})


def test_plan_gives_every_worker_the_kv_methods_and_its_port(tmp_path):
    from refengine.kv.registry import KVMethods

    kv = KVMethods.parse({"fp8": {}})
    plan = cli.plan_stack(_args(kv_methods=kv, worker_arg=["--cpu-affinity=0"], policy="least_loaded"),
                          tmp_path / "smol")
    assert plan.name == "smol" and plan.worker_urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    for (name, cmd), port in zip(plan.workers, (8100, 8101)):
        assert name == f"worker {port - 8099} (:{port})" and cmd[:3] == [sys.executable, "-m", "worker"]
        i = cmd.index("--kv-methods")
        assert json.loads(cmd[i + 1]) == {"fp8": {}} and cmd[cmd.index("--port") + 1] == str(port)
        assert cmd.count("--cpu-affinity=0") == 1 and "--cpu-affinity" not in cmd    # the user's, not ours
    gw_name, gw = plan.gateway
    assert gw_name == "gateway (:8000)" and gw[gw.index("--workers") + 1] == ",".join(plan.worker_urls)
    assert gw[-2:] == ["--policy", "least_loaded"] and plan.gateway_url == "http://127.0.0.1:8000"
