"""Scoring and the rest of the API on the real reference engine, through the gateway.

One worker (SmolLM2, reference engine) behind one gateway process, shared by the module:
lm-evaluation-harness (``local-completions``, offline, our own JSON tasks) runs a
multiple-choice task whose loglikelihoods must equal the engine's own ``score()`` within
1e-3 nats per token, and a generation task whose outputs must equal greedy completions;
the official openai SDK drives the Responses API (streaming and not), ``logit_bias`` and
``echo``; /tokenize and /detokenize round-trip."""


import httpx
import openai
import pytest
from benchmarks.lib.lm_eval import generations, loglikelihood_pairs, run_lm_eval
from worker_test_fakes import real_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.model]

CHAT = [{"role": "user", "content": "Name one colour of the rainbow."}]


@pytest.fixture(scope="module")
def engine_config(smollm2_dir):
    from refengine.config import EngineConfig

    return EngineConfig(model=str(smollm2_dir), max_model_len=1024, num_kv_blocks=256, max_num_seqs=8)


@pytest.fixture(scope="module")
def stack(smollm2_dir, engine_config):
    with real_stack(smollm2_dir, engine_config) as url:
        yield url


@pytest.fixture(scope="module")
def engine(engine_config):
    from refengine.engine import LLMEngine

    return LLMEngine(engine_config)


@pytest.fixture(scope="module")
def sdk(stack):
    client = openai.OpenAI(base_url=stack + "/v1", api_key="unused", max_retries=0, timeout=300)
    yield client
    client.close()


@pytest.fixture(scope="module")
def lm_eval_run(stack, smollm2_dir, tmp_path_factory):
    return run_lm_eval(stack, "smol", smollm2_dir, tmp_path_factory.mktemp("lm_eval"))


def test_lm_eval_loglikelihoods_equal_the_engines_score(lm_eval_run, engine):
    results, lm = lm_eval_run
    pairs = loglikelihood_pairs(results, lm)
    assert len(pairs) == 32                                     # 8 questions x 4 choices
    scores = engine.score([(ctx, cont) for _, _, ctx, cont in pairs])
    for (ll, greedy, _, cont), sc in zip(pairs, scores):
        assert abs(ll - sum(s[0] for s in sc)) / len(cont) < 1e-3
        assert greedy == all(s[1] == t for s, t in zip(sc, cont))
    assert 0.0 <= results["results"]["swiftserve_mc"]["acc,none"] <= 1.0


def test_lm_eval_generations_equal_greedy_completions(lm_eval_run, sdk):
    results, _ = lm_eval_run
    gens = generations(results)
    assert len(gens) == 3
    for prompt, text in gens:
        r = sdk.completions.create(model="smol", prompt=prompt, max_tokens=8, temperature=0, stop=["\n"])
        assert text == r.choices[0].text


def test_echo_scoring_through_the_sdk(sdk, engine, smollm2_dir):
    from transformers import AutoTokenizer

    prompt = "The quick brown fox jumps over the lazy dog."
    ids = AutoTokenizer.from_pretrained(smollm2_dir).encode(prompt)
    texts = sdk.completions.create(model="smol", prompt=[prompt, "Hello there."], max_tokens=0, echo=True,
                                   logprobs=2)
    assert [c.text for c in texts.choices] == [prompt, "Hello there."] and texts.usage.completion_tokens == 0
    r = sdk.completions.create(model="smol", prompt=[ids, ids[:5]], max_tokens=0, echo=True, logprobs=2)
    assert r.choices[0].text == prompt and r.choices[0].logprobs == texts.choices[0].logprobs
    assert len(r.choices[1].logprobs.tokens) == 5
    (score,) = engine.score([(ids[:1], ids[1:])])
    for c in r.choices[:1]:
        lp = c.logprobs
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == len(ids)
        assert max(abs(a - s[0]) for a, s in zip(lp.token_logprobs[1:], score)) < 1e-3
        assert all(len(t) <= 3 for t in lp.top_logprobs[1:])
    plp = sdk.completions.create(model="smol", prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 1}
                                 ).choices[0].model_extra["prompt_logprobs"]
    assert plp[0] is None and len(plp) == len(ids)
    for entry, t, s in zip(plp[1:], ids[1:], score):        # vLLM's shape: the token's rank, then the best
        mine = entry[str(t)]
        assert abs(mine["logprob"] - s[0]) < 1e-3 and mine["rank"] >= 1 and mine["decoded_token"]
        assert (mine["rank"] == 1) == (s[1] == t)
    gen = sdk.completions.create(model="smol", prompt=prompt, max_tokens=3, echo=True, logprobs=1, temperature=0)
    c = gen.choices[0]
    assert c.text.startswith(prompt) and len(c.logprobs.tokens) == len(ids) + 3
    assert "".join(c.logprobs.tokens) == c.text


def test_logit_bias_through_the_sdk(sdk, engine, smollm2_dir):
    from transformers import AutoTokenizer

    from refengine.sampling_params import SamplingParams

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    prompt = "The capital of France is"
    ((first,),) = engine.generate([tok.encode(prompt)], SamplingParams(max_tokens=1, temperature=0))
    plain = sdk.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0)
    assert plain.choices[0].text == tok.decode([first])
    banned = sdk.completions.create(model="smol", prompt=prompt, max_tokens=1, temperature=0,
                                    logit_bias={str(first): -100})
    assert banned.choices[0].text != plain.choices[0].text
    target = tok.encode(" banana")[0]
    forced = sdk.chat.completions.create(model="smol", messages=CHAT, max_tokens=3, temperature=0.9, seed=1,
                                         logit_bias={str(target): 100})
    assert forced.choices[0].message.content == tok.decode([target] * 3)


def test_responses_api_with_the_sdk(sdk):
    chat = sdk.chat.completions.create(model="smol", messages=[{"role": "system", "content": "Be brief."}, *CHAT],
                                       max_tokens=12, temperature=0)
    r = sdk.responses.create(model="smol", instructions="Be brief.", input=CHAT[0]["content"], max_output_tokens=12,
                             temperature=0, store=False)
    assert r.output_text == chat.choices[0].message.content
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert r.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    events = list(sdk.responses.create(model="smol", instructions="Be brief.",
                                       input=[{"role": "user", "content": [{"type": "input_text",
                                                                            "text": CHAT[0]["content"]}]}],
                                       max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == r.output_text == events[-1].response.output_text
    for bad in ({"store": True}, {"previous_response_id": "resp_1"}, {"tools": [{"type": "web_search"}]}):
        with pytest.raises(openai.BadRequestError) as e:
            sdk.responses.create(model="smol", input="hi", **bad)
        assert "not supported" in e.value.body["message"]


def test_tokenize_and_detokenize_through_the_gateway(stack, sdk):
    t = httpx.post(stack + "/tokenize", json={"prompt": "Hello world", "return_token_strs": True}).json()
    assert t["count"] == len(t["tokens"]) == len(t["token_strs"]) and t["max_model_len"] == 1024
    assert httpx.post(stack + "/detokenize", json={"model": "smol", "tokens": t["tokens"]}).json() == \
        {"prompt": "Hello world"}
    chat = httpx.post(stack + "/tokenize", json={"model": "smol", "messages": CHAT}).json()
    usage = sdk.chat.completions.create(model="smol", messages=CHAT, max_tokens=1).usage
    assert chat["count"] == usage.prompt_tokens and chat["token_strs"] is None
    r = httpx.post(stack + "/detokenize", json={"tokens": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
