"""``swiftserve up``'s steps without starting a stack: argument checks, the workers' KV check
before any process starts (with every engine input), and the command lines it plans."""

import json
import sys
from types import SimpleNamespace

import pytest

from swiftserve import cli
from swiftserve.stack_models import parse_specs


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
                drain_timeout=30.0, policy=None, kv_methods=None, worker_arg=[], alias=[], models_config=None,
                shadow_fraction=0.0, gateway_arg=[])
    return SimpleNamespace(**{**base, **kw})


def _specs(*dirs_and_counts, names=None):
    specs = parse_specs([f"{d}:{n}" for d, n in dirs_and_counts], names, 2)
    for spec, (d, _) in zip(specs, dirs_and_counts):
        spec.dir = d
    return specs


def test_plan_gives_every_worker_the_kv_methods_and_its_port(tmp_path):
    from refengine.kv.registry import KVMethods

    kv = KVMethods.parse({"fp8": {}})
    plan = cli.plan_stack(_args(kv_methods=kv, worker_arg=["--cpu-affinity=0"], policy="least_loaded"),
                          _specs((tmp_path / "smol", 2)))
    assert plan.names == ["smol"] and plan.worker_urls == ["http://127.0.0.1:8100", "http://127.0.0.1:8101"]
    for (name, cmd), port in zip(plan.workers, (8100, 8101)):
        assert name == f"worker {port - 8099} (:{port})" and cmd[:3] == [sys.executable, "-m", "worker"]
        i = cmd.index("--kv-methods")
        assert json.loads(cmd[i + 1]) == {"fp8": {}} and cmd[cmd.index("--port") + 1] == str(port)
        assert cmd.count("--cpu-affinity=0") == 1 and "--cpu-affinity" not in cmd    # the user's, not ours
    gw_name, gw = plan.gateway
    assert gw_name == "gateway (:8000)" and gw[gw.index("--workers") + 1] == ",".join(plan.worker_urls)
    assert gw[-2:] == ["--policy", "least_loaded"] and plan.gateway_url == "http://127.0.0.1:8000"


def test_several_models_each_with_its_workers_and_the_gateway_with_the_split(tmp_path):
    specs = _specs((tmp_path / "orig", 2), (tmp_path / "fast", 1))
    args = _args(alias=["smol=orig:90,fast:10"], shadow_fraction=0.2, gateway_arg=["--shadow-max-rps=5"])
    assert cli.check_models(args, specs) is None
    plan = cli.plan_stack(args, specs)
    assert plan.names == ["orig", "fast"] and len(plan.worker_urls) == 3
    served = [cmd[cmd.index("--served-model-name") + 1] for _, cmd in plan.workers]
    assert served == ["orig", "orig", "fast"] and plan.workers[2][0] == "worker 3 (:8102, fast)"
    gw = plan.gateway[1]
    assert "--alias=smol=orig:90,fast:10" in gw and gw[gw.index("--shadow-fraction") + 1] == "0.2"
    assert "--shadow-max-rps=5" in gw
    # the gateway parses what up gives it
    from gateway.cli import parse_args
    cfg = parse_args(gw[3:])
    assert cfg.aliases[0].shadow.reference == "orig" and len(cfg.workers) == 3


def test_model_specs_and_their_refusals(tmp_path, capsys):
    a, b = parse_specs(["default", "SmolLM2-135M-Instruct-SwiftKV:3"], None, 2)
    assert (a.source, a.workers, b.source, b.workers) == ("default", 2, "SmolLM2-135M-Instruct-SwiftKV", 3)
    odd = tmp_path / "dir:7"
    odd.mkdir()
    assert parse_specs([str(odd)], ["x"], 1)[0].source == str(odd)          # an existing path keeps its colon
    with pytest.raises(ValueError, match="once per --model"):
        parse_specs(["a", "b"], ["x"], 1)
    with pytest.raises(ValueError, match=">= 1"):
        parse_specs(["a:0"], None, 1)
    same = _specs((tmp_path / "m", 1), (tmp_path / "other" / "m", 1))
    assert "both served as 'm'" in cli.check_models(_args(), same)
    two = _specs((tmp_path / "orig", 1), (tmp_path / "fast", 1))
    assert "names ghost, which no --model serves" in cli.check_models(_args(alias=["s=orig,ghost"]), two)
    assert cli.main(["up", "--model", "a", "--model", "b", "--served-model-name", "x"]) == 2
    assert "once per --model" in capsys.readouterr().err
