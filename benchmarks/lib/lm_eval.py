"""lm-evaluation-harness against a served endpoint, offline, on SwiftServe's own tiny tasks.

``run_lm_eval(url, model, tokenizer_dir, tmp)`` writes two task configs pointing at
``benchmarks/lib/data/lm_eval`` (``swiftserve_mc``: multiple choice, i.e. loglikelihood requests
sent as ``echo`` + ``logprobs`` with batched token-id prompts; ``swiftserve_gen``:
generate_until), builds lm-eval's ``local-completions`` model on ``url`` and evaluates
both with ``log_samples``. Nothing is downloaded: the datasets are local JSON files read
by the ``json`` builder with ``HF_DATASETS_OFFLINE`` / ``HF_HUB_OFFLINE`` set, and the
tokenizer is the served model's directory.

``loglikelihood_pairs(results, lm)`` returns, for every loglikelihood request, lm-eval's
answer and the (context, continuation) token ids lm-eval itself made from it, so a test
can score exactly those ids with the engine's own ``score()``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "lm_eval"

# lm-eval reads task YAML; JSON is YAML, so the configs are written from these dicts.
MEAN = {"aggregation": "mean", "higher_is_better": True}
TASKS = {
    "swiftserve_mc": {"data": "mc.jsonl", "output_type": "multiple_choice",
                      "doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_choice": "{{choices}}",
                      "doc_to_target": "{{answer}}", "target_delimiter": "", "metric_list": [{"metric": "acc", **MEAN}]},
    "swiftserve_gen": {"data": "gen.jsonl", "output_type": "generate_until", "doc_to_text": "{{prompt}}",
                       "doc_to_target": "{{target}}", "metric_list": [{"metric": "exact_match", **MEAN}],
                       "generation_kwargs": {"until": ["\n"], "max_gen_toks": 8, "temperature": 0}},
}


def write_tasks(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, spec in TASKS.items():
        spec = dict(spec)
        files = {"data_files": {"test": str(DATA / spec.pop("data"))}}
        config = {"task": name, "dataset_path": "json", "dataset_kwargs": files, "test_split": "test", **spec}
        (folder / f"{name}.yaml").write_text(json.dumps(config, indent=1))
    return folder


def offline_env() -> None:
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[name] = "1"


# Set when a test module imports this (collection), before anything reads them: the hub
# libraries read these variables once, at their own import.
offline_env()


def run_lm_eval(url: str, model: str, tokenizer_dir, tmp: Path, batch_size: int = 4):
    """-> (lm-eval's results dict, the LM object). ``url``: the server's base (no /v1)."""
    offline_env()
    from lm_eval import simple_evaluate
    from lm_eval.models.openai_completions import LocalCompletionsAPI
    from lm_eval.tasks import TaskManager

    tasks = write_tasks(tmp / "lm_eval_tasks")
    lm = LocalCompletionsAPI(base_url=url + "/v1/completions", model=model, tokenizer_backend="huggingface",
                             tokenizer=str(tokenizer_dir), tokenized_requests=True, batch_size=batch_size,
                             num_concurrent=1, max_retries=1, timeout=300)
    results = simple_evaluate(model=lm, tasks=list(TASKS),
                              task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
                              log_samples=True, bootstrap_iters=0, random_seed=0)
    return results, lm


def loglikelihood_pairs(results: dict, lm) -> list[tuple[float, bool, list[int], list[int]]]:
    """(lm-eval's loglikelihood, its is_greedy, context ids, continuation ids) per request."""
    out = []
    for sample in results["samples"]["swiftserve_mc"]:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ll, greedy = resp[0]
            ctx, cont = lm._encode_pair(context, continuation)
            out.append((float(ll), bool(greedy), ctx, cont))
    return out


def generations(results: dict) -> list[tuple[str, str]]:
    """(prompt, lm-eval's generated text) per generate_until request."""
    return [(s["arguments"][0][0], s["resps"][0][0]) for s in results["samples"]["swiftserve_gen"]]
