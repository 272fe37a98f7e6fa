"""Structured outputs in the reference engine: token masks applied in the sampler, on the real model.

A constrained request's output must match its grammar (JSON schema, regex, choice, grammar);
unconstrained requests in the same batch must give exactly what they give alone (greedy), so
masks touch only their own rows; a schema is compiled once while it stays cached."""

import json
import re

import jsonschema
import pytest
import torch

from refengine.config import EngineConfig
from refengine.engine import LLMEngine
from refengine.sampler import SampleRow, sample
from refengine.sampling_params import SamplingParams
from refengine.structured.masks import TokenMasks
from refengine.structured.spec import StructuredSpec

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "age", "tags"],
          "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0,
                                                                                "maximum": 120},
                         "tags": {"type": "array", "items": {"enum": ["red", "green"]}, "maxItems": 3}}}


def test_masks_apply_to_their_rows_only():
    torch.manual_seed(0)
    logits = torch.randn(3, 70)
    bits = torch.zeros(2, 3, dtype=torch.int32)
    bits[0, 1] = 1 << 5          # row 0: only token 37
    bits[1, 2] = 1 << 1          # row 2: only token 65
    rows = [SampleRow(SamplingParams(temperature=0), [1], 1, None, ()) for _ in range(3)]
    tokens, _ = sample(logits.clone(), rows, None, TokenMasks([0, 2], bits))
    assert tokens == [37, int(logits[1].argmax()), 65]
    rows[0] = SampleRow(SamplingParams(temperature=1.0), [1], 1, torch.Generator().manual_seed(1), ())
    for _ in range(5):           # random rows too: a masked token has probability 0
        assert sample(logits.clone(), rows, torch.Generator(), TokenMasks([0, 2], bits))[0][0] == 37


@pytest.fixture(scope="module")
def eng(smollm2_dir):
    return LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=512, num_kv_blocks=256, max_num_seqs=8))


@pytest.fixture(scope="module")
def chat(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)

    def render(text: str) -> list[int]:
        return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                  add_generation_prompt=True), add_special_tokens=False)
    render.decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
    return render


def spec_json(schema) -> StructuredSpec:
    return StructuredSpec("json", json.dumps(schema))


@pytest.mark.slow
@pytest.mark.model
def test_json_schema_output_validates_and_leaves_others_alone(eng, chat):
    free = SamplingParams(max_tokens=24, temperature=0)
    prompts = [chat("Describe a person as JSON."), chat("What is the capital of France?"),
               chat("Give me a fictional user profile."), chat("Write a haiku about the sea.")]
    alone = eng.generate([prompts[1], prompts[3]], free)
    con = SamplingParams(max_tokens=80, temperature=0, structured=spec_json(SCHEMA))
    hot = SamplingParams(max_tokens=80, temperature=1.0, seed=7, structured=spec_json(SCHEMA))
    outs = eng.generate(prompts, [con, free, hot, free])
    assert [outs[1], outs[3]] == alone
    for ids in (outs[0], outs[2]):
        assert ids[-1] in eng.eos_token_ids, chat.decode(ids)      # the grammar ended it, well before max_tokens
        jsonschema.validate(json.loads(chat.decode(ids)), SCHEMA)


@pytest.mark.slow
@pytest.mark.model
@pytest.mark.parametrize("spec,ok,temperatures", [
    (StructuredSpec("choice", json.dumps(["yes", "no", "maybe not"])), lambda s: s in ("yes", "no", "maybe not"),
     (0, 1.0)),
    (StructuredSpec("regex", r"[0-9]{3}-[a-z]{2,4}"), lambda s: re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", s), (0, 1.0)),
    (StructuredSpec("grammar", 'root ::= "The answer is " ("A" | "B") "."'),
     lambda s: s in ("The answer is A.", "The answer is B."), (0, 1.0)),
    (StructuredSpec("grammar", 'start: "x" NUM\nNUM: /[1-9][0-9]?/'), lambda s: re.fullmatch(r"x[1-9][0-9]?", s),
     (0, 1.0)),
    # Any object: free keys and strings; sampled at temperature 1 one may outrun max_tokens (then "length").
    (StructuredSpec("json", '{"type":"object"}'), lambda s: isinstance(json.loads(s), dict), (0,)),
])
def test_other_constraints(eng, chat, spec, ok, temperatures):
    for temperature in temperatures:
        ids = eng.generate([chat("Answer the question.")],
                           SamplingParams(max_tokens=60, temperature=temperature, seed=3, structured=spec))[0]
        assert ok(chat.decode(ids)), chat.decode(ids)


@pytest.mark.slow
@pytest.mark.model
def test_grammar_is_compiled_once_and_length_still_ends(eng, chat):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    masks = eng.runner.grammar
    before = masks.compiled
    p = SamplingParams(max_tokens=6, temperature=0, structured=spec_json(schema))
    rid = "length-1"
    eng.add_request(rid, chat("Tell a long story."), p)
    eng.add_request("length-2", chat("Tell another long story."), p)
    finished = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finished[out.request_id] = (out.finish_reason, out.num_output_tokens)
    assert finished == {rid: ("length", 6), "length-2": ("length", 6)}
    assert masks.compiled == before + 1 and masks.cache_hits >= 1
    assert masks._states == {}                 # released with their requests
    assert masks.mask_ms and min(masks.mask_ms) >= 0


@pytest.mark.model
def test_masks_beside_the_forward_pass_equal_inline_ones(smollm2_dir):
    from refengine.model_config import load_model_spec
    from refengine.structured.masks import GrammarMasks

    spec = load_model_spec(str(smollm2_dir))
    made = [GrammarMasks(str(smollm2_dir), spec.vocab_size, spec.eos_token_ids, overlap=o) for o in (True, False)]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    out_ids = [[], tok.encode('{"name":"A', add_special_tokens=False)]
    todo = [(0, "a", spec_json(SCHEMA), out_ids[0], []), (3, "b", spec_json(SCHEMA), out_ids[1], [])]   # no drafts
    got = [m.result(m.start(todo)) for m in made]
    assert got[0].rows == got[1].rows == [0, 3]
    assert torch.equal(got[0].bits, got[1].bits)
    allowed = lambda bits, t: bool((int(bits[t // 32]) >> (t % 32)) & 1)   # noqa: E731
    assert allowed(got[0].bits[0], tok.encode('{"', add_special_tokens=False)[0])     # the object must open
    assert not allowed(got[0].bits[0], tok.encode("Hello", add_special_tokens=False)[0])
    for m in made:
        m.release("a")
        m.release("b")
        m.close()


@pytest.mark.model
def test_draft_rows_follow_the_grammar_and_end_with_eos_only(smollm2_dir):
    # Speculative decoding: row i masks the token after drafts[:i]; after a draft that ends the grammar
    # only EOS is allowed; a refused draft leaves the rows after it unused (all allowed) and the
    # request's matcher untouched (the next step catches up from its real output).
    from transformers import AutoTokenizer

    from refengine.model_config import load_model_spec
    from refengine.structured.masks import GrammarMasks

    spec = load_model_spec(str(smollm2_dir))
    masks = GrammarMasks(str(smollm2_dir), spec.vocab_size, spec.eos_token_ids, overlap=False)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    schema = spec_json({"type": "object", "properties": {"a": {"enum": ["x"]}}, "required": ["a"],
                        "additionalProperties": False})
    allowed = lambda bits, t: bool((int(bits[t // 32]) >> (t % 32)) & 1)   # noqa: E731
    whole = tok.encode('{"a":"x"}', add_special_tokens=False)
    eos = spec.eos_token_ids[0]
    got = masks.result(masks.start([(0, "r", schema, [], whole)]))
    assert got.rows == list(range(len(whole) + 1))
    for i, t in enumerate(whole):
        assert allowed(got.bits[i], t)                       # each draft allowed by the row before it
    last = got.bits[len(whole)]
    assert allowed(last, eos) and sum(allowed(last, t) for t in range(spec.vocab_size)) == 1
    bad = tok.encode("Hello", add_special_tokens=False)[0]
    got = masks.result(masks.start([(0, "r", schema, [], [whole[0], bad, whole[1]])]))
    assert not allowed(got.bits[1], bad) and bool((got.bits[2:] == -1).all())
    got = masks.result(masks.start([(0, "r", schema, whole[:1], [])]))   # the matcher is still usable
    assert allowed(got.bits[0], whole[1])
    masks.release("r")
    masks.close()


def test_json_number_state_caps_only_long_fractions():
    from refengine.structured.numbers import JsonNumberState

    def capped(text: str) -> bool:
        st = JsonNumberState()
        st.feed(text.encode())
        return st.capped

    assert capped('{"x":0.54228000000000017') and capped('[1234567890.1234567')
    assert not capped('{"x":0.5422800000000001')                  # 16 significant digits
    assert not capped('{"x":0.0000000000000000001234')            # leading zeros are not significant
    assert not capped('{"id":123456789012345678901234')           # integers are not capped
    assert not capped('{"x":1.2345678901234567e1')                # the exponent is free
    assert not capped('{"s":"0.123456789012345678') and not capped('{"s":"\\"0.12345678901234567890')
    assert capped('{"s":"a\\"b","x":-3.1415926535897932')         # escaped quote closed, then a number
    assert not capped('{"x":1.23456789012345678,"y":')            # ended by the comma


@pytest.mark.model
def test_a_capped_fraction_offers_no_digit(smollm2_dir):
    from transformers import AutoTokenizer

    from refengine.model_config import load_model_spec
    from refengine.structured.masks import GrammarMasks

    spec = load_model_spec(str(smollm2_dir))
    masks = GrammarMasks(str(smollm2_dir), spec.vocab_size, spec.eos_token_ids, overlap=False)
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    schema = spec_json({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]})
    allowed = lambda bits, t: bool((int(bits[t // 32]) >> (t % 32)) & 1)   # noqa: E731
    digit, comma_close = tok.encode("3", add_special_tokens=False)[0], tok.encode("}", add_special_tokens=False)[0]
    for text, digits_ok in (('{"x":0.5422800000000001', True), ('{"x":0.54228000000000017', False)):
        bits = masks.result(masks.start([(0, text, schema, tok.encode(text, add_special_tokens=False), [])])).bits[0]
        assert allowed(bits, digit) == digits_ok and allowed(bits, comma_close), text
        masks.release(text)
    masks.close()
