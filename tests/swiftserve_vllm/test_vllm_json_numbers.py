"""The JSON number cap as a vLLM logits processor (``swiftserve_vllm.json_numbers``), run in the
vLLM environment without a server: a capped JSON request loses its digit tokens, an uncapped
one and a request without a JSON constraint keep them, and the state follows vLLM's batch moves."""

import json
import subprocess

import pytest
from vllm_support import VLLM_PY, needs_vllm

pytestmark = [pytest.mark.e2e, pytest.mark.model, needs_vllm]

SCRIPT = r"""
import json, sys, types
import torch
from transformers import AutoTokenizer
from vllm import SamplingParams
from vllm.sampling_params import StructuredOutputsParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality
from swiftserve_vllm.json_numbers import JsonNumberCap

model = sys.argv[1]
tok = AutoTokenizer.from_pretrained(model)
V = len(tok)
cfg = types.SimpleNamespace(model_config=types.SimpleNamespace(tokenizer=model, get_vocab_size=lambda: V))
cap = JsonNumberCap(cfg, torch.device("cpu"), False)
js = SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "object"}))
ids = lambda t: tok.encode(t, add_special_tokens=False)
long_, short = ids('{"x":0.54228000000000017'), ids('{"x":0.5422800000000001')
cap.update_state(BatchUpdate(batch_size=3, removed=[], moved=[],
                             added=[(0, js, None, long_), (1, js, None, short), (2, SamplingParams(), None, long_)]))
digit, brace = ids("3")[0], ids("}")[0]
out = cap.apply(torch.zeros(3, V))
res = {"rows": [[bool(torch.isinf(out[i, digit])), bool(torch.isinf(out[i, brace]))] for i in range(3)]}
cap.update_state(BatchUpdate(batch_size=3, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
out = cap.apply(torch.zeros(3, V))
res["swapped"] = [bool(torch.isinf(out[i, digit])) for i in range(3)]
only_digits = torch.full((3, V), float("-inf"))
only_digits[:, digit] = 0.0
res["kept_when_nothing_else"] = bool(torch.isfinite(cap.apply(only_digits)[1, digit]))
print(json.dumps(res))
"""


def test_json_number_cap_on_vllm(smollm2_dir):
    r = subprocess.run([str(VLLM_PY), "-c", SCRIPT, str(smollm2_dir)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["rows"] == [[True, False], [False, False], [False, False]]      # capped, short, unconstrained
    assert res["swapped"] == [False, True, False]                             # the state moved with its row
    assert res["kept_when_nothing_else"]
