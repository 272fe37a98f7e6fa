"""``swiftserve-worker`` / ``python -m worker``: serve one model over the OpenAI API.

The flags and the ``WorkerConfig`` they build are ``worker.args``; here are the checks before
anything loads (``checked_config``: the model resolves, and the engine's own KV check runs
with every input; ``preflight``, which ``swiftserve up`` runs on its workers' arguments) and
``main``. The entry point builds
the one ``WorkerConfig`` (with its ``EngineConfig``), resolves ``--model``
(``default`` = the embedded SmolLM2-135M-Instruct, prepared on first use), loads
the tokenizer, creates the engine client through
``worker.backends.create_engine_client`` and serves with uvicorn. The engine is
started by the app's lifespan, so ``/health`` answers only once it is ready.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from refengine.config import EngineConfig
from refengine.kv import registry as kv_registry
from refengine.kv.base import MethodError
from refengine.spec.check import check_speculation
from worker.args import build_parser, check_args, config_from_args
from worker.config import WorkerConfig

log = logging.getLogger("worker")


def _kv_reason(engine_config: EngineConfig) -> str | None:
    """Why the reference engine would refuse this KV setting: the engine's own check
    (``registry.check_engine``) with every input it uses (model, block size, KV dtype, SwiftKV),
    and whether speculative decoding composes with the planned methods (``refengine.spec.check``)."""
    try:
        plan = kv_registry.check_engine(engine_config)
    except (MethodError, ValueError) as exc:       # ValueError: a config.json the spec reader refuses
        return f"--kv-methods: {exc}"
    try:
        check_speculation(engine_config.speculative_config, plan.methods)
    except ValueError as exc:
        return f"--speculative-config: {exc}"
    return None


def _vllm_reason(config: WorkerConfig) -> str | None:
    """Why vLLM cannot serve this configuration (KV methods, parallelism), before vLLM is imported;
    the platform is guessed from torch (vLLM's own check runs again when it starts)."""
    from worker.backends.vllm import build_settings

    try:
        import torch

        build_settings(config, "cuda" if torch.cuda.is_available() else "cpu")
    except (ValueError, OSError) as exc:
        return str(exc)
    return None


def checked_config(args: argparse.Namespace) -> tuple[WorkerConfig | None, str | None]:
    """(the WorkerConfig, None), or (None, why it cannot serve): the model resolves, and its KV
    methods (and, for vLLM, parallelism) are checked against it before anything loads.
    ``swiftserve up`` runs the same check on its workers' arguments before starting them."""
    try:
        config = config_from_args(args)
    except Exception as exc:  # noqa: BLE001 - PrepareError and friends: a message, not a traceback
        return None, f"cannot use model {args.model!r}: {exc}"
    if config.engine == "reference":
        reason = _kv_reason(config.engine_config)
        return (None, reason) if reason else (config, None)
    reason = _vllm_reason(config)
    return (None, reason) if reason else (config, None)


def preflight(argv: list[str]) -> str | None:
    """The worker's own argument and model checks for ``argv``; None when it would start."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_args(args, parser)
    except SystemExit:
        return "invalid worker arguments (see the message above)"
    return checked_config(args)[1]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_args(args, parser)
    if args.cpu_affinity:
        os.sched_setaffinity(0, args.cpu_affinity)       # before threads or children exist
    level = "DEBUG" if args.log_level == "trace" else args.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config, reason = checked_config(args)
    if reason:                            # before the model loads: a message, not a traceback
        print(f"swiftserve-worker: {reason}", file=sys.stderr)
        return 2

    import uvicorn
    from transformers import AutoTokenizer

    from worker.app import build_app
    from worker.backends import create_engine_client

    log.info("loading tokenizer from %s", config.tokenizer_path)
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
    engine = create_engine_client(config)
    app = build_app(config, engine, tokenizer)
    log.info("serving %s (%s) on http://%s:%d", config.model_name, config.model_dir, config.host, config.port)
    if config.dtype_note:
        log.info("%s", config.dtype_note)
    from swiftcommon.logs import quiet_probe_logs

    quiet_probe_logs()
    from worker.shutdown import ENGINE_DEAD_EXIT, DrainingServer

    server = DrainingServer(uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                                           timeout_graceful_shutdown=10), app.state.serving, config.drain_timeout)
    server.run()
    return ENGINE_DEAD_EXIT if server.engine_dead else 0


if __name__ == "__main__":
    sys.exit(main())
