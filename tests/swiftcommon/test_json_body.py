"""``swiftcommon.json_body``: the one JSON reader of the gateway and the worker (orjson where it
reads a document as the json module does, the json module elsewhere; big integers by policy)
and ``json_text``."""

from __future__ import annotations

import json

import orjson
import pytest

from swiftcommon.json_body import json_text, parse_json

DOCS = ['{"a": NaN}', '{"a": 123456789012345678901234567890}', '{"a": "\\ud800"}',
        '[18446744073709551616, -9223372036854775809, 18446744073709551615]', '[1e400]',
        "[" * 900 + "]" * 900, '{"a": 1.5e300, "b": [true, null, "x"]}']


@pytest.mark.parametrize("doc", DOCS)
def test_exact_gives_what_the_json_module_gives(doc):
    got, want = parse_json(doc.encode(), big_ints="exact"), json.loads(doc)
    assert json.dumps(got, allow_nan=True) == json.dumps(want, allow_nan=True)


@pytest.mark.parametrize("doc", DOCS)
def test_float_reads_big_integers_as_orjson_does_and_orjson_can_write_the_result(doc):
    got = parse_json(doc.encode(), big_ints="float")
    want = json.loads(doc, parse_int=lambda t: int(t) if -(1 << 63) <= int(t) < (1 << 64) else float(t))
    assert json.dumps(got, allow_nan=True) == json.dumps(want, allow_nan=True)
    if "18446744073709551616" in doc or "123456789012345678901234567890" in doc:
        orjson.dumps(got)                           # beyond 64 bits: floats, which orjson writes again


@pytest.mark.parametrize("big_ints", ["exact", "float"])
def test_refuses_what_the_json_module_refuses(big_ints):
    for bad in (b"{", b'{"a": 1', b"\xff\xfe"):
        with pytest.raises(ValueError):
            parse_json(bad, big_ints=big_ints)
    with pytest.raises(RecursionError):             # deeper than either parser goes
        parse_json(b"[" * 5000 + b"]" * 5000, big_ints=big_ints)


def test_json_text_is_compact_json_also_where_orjson_refuses():
    for value in ([{"b": 1, "a": [1.5, None, "é"]}], {"big": 2**70}, ["\ud800"], [{"z": 1, "a": 2}]):
        text = json_text(value, sort_keys=True)
        assert json.loads(text) == json.loads(json.dumps(value, sort_keys=True))
        assert text == json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert json_text({"z": 1, "a": 2}) == '{"z":1,"a":2}'
