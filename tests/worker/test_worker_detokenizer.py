"""Incremental detokenisation (multi-byte UTF-8 over byte tokens) and stop strings."""

import random

import pytest
from worker_test_fakes import byte_tokens

from worker.detokenizer import IncrementalDetokenizer, OutputText, StopStringMatcher

TEXT = "héllo wörld 日本語 🎉 café, Hello world!"


def stream(detok, ids):
    pieces = [detok.add(t) for t in ids]
    return pieces, detok.flush()


def test_byte_split_characters_are_never_emitted_half(tokenizer):
    ids = byte_tokens(tokenizer, TEXT)
    assert len(ids) == len(TEXT.encode())            # really one token per byte
    pieces, tail = stream(IncrementalDetokenizer(tokenizer, []), ids)
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + tail == TEXT
    assert tail == ""
    # Each emitted piece is a whole character: the 3 bytes of 日 come out as one delta.
    assert "日" in pieces and "🎉" in pieces


@pytest.mark.parametrize("seed", range(5))
def test_concatenated_deltas_equal_full_decode(tokenizer, seed):
    rng = random.Random(seed)
    normal = tokenizer.encode(TEXT, add_special_tokens=False)
    ids = []
    for _ in range(60):
        ids.append(rng.choice(normal))
        if rng.random() < 0.3:
            ids += byte_tokens(tokenizer, rng.choice("é日🎉ö"))
    prompt = tokenizer.encode("Hello world", add_special_tokens=False)
    pieces, tail = stream(IncrementalDetokenizer(tokenizer, prompt), ids)
    assert "".join(pieces) + tail == tokenizer.decode(ids)


def test_special_tokens_skipped_or_kept(tokenizer):
    enc = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    ids = enc("Hello") + [2] + enc(" world")
    p, t = stream(IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=True), ids)
    assert "".join(p) + t == "Hello world"
    p, t = stream(IncrementalDetokenizer(tokenizer, [1], skip_special_tokens=False), ids)
    assert "".join(p) + t == "Hello<|im_end|> world"


def test_unfinished_character_is_flushed_at_the_end(tokenizer):
    ids = byte_tokens(tokenizer, "a日")[:-1]         # 'a' + 2 of the 3 bytes of 日
    d = IncrementalDetokenizer(tokenizer, [])
    assert [d.add(t) for t in ids] == ["a", "", ""]
    assert d.flush() == "\ufffd"


# ---- stop strings ---------------------------------------------------------------------------
def feed_all(m, chunks):
    return [m.feed(c) for c in chunks]


def test_stop_string_across_chunks_and_withheld_prefix():
    m = StopStringMatcher(["STOP"])
    out = feed_all(m, ["Hello S", "T", "O", "P and more"])
    assert out == ["Hello ", "", "", ""]
    assert m.hit == "STOP"
    assert m.feed("anything") == ""


def test_withheld_prefix_is_released_when_it_turns_out_not_to_be_a_stop():
    m = StopStringMatcher(["STOP"])
    assert m.feed("ab ST") == "ab "
    assert m.feed("ORM") == "STORM"
    assert m.hit is None
    assert m.feed("S") == ""
    assert m.flush() == "S"


def test_include_stop_str_and_earliest_stop_wins():
    m = StopStringMatcher(["world", "lo w"], include_stop_str=True)
    assert m.feed("Hello world") == "Hello w"
    assert m.hit == "lo w"


def test_stop_inside_one_chunk_truncates():
    m = StopStringMatcher(["\n\n"])
    assert m.feed("line one\n\nline two") == "line one"


def test_output_text_stop_spanning_tokens(tokenizer):
    ids = tokenizer.encode(" Hello world, STOP here", add_special_tokens=False)
    out = OutputText(tokenizer, [], stops=("STOP",))
    released = []
    for t in ids:
        d = out.add_tokens([t])
        released.append(d.text)
        if d.stop_string:
            break
    assert d.stop_string == "STOP"
    assert out.text == " Hello world, "
    assert "".join(released) == out.text


def test_output_text_min_tokens_delays_stop_checks(tokenizer):
    ids = tokenizer.encode("STOP Hello STOP", add_special_tokens=False)
    first_stop_end = len(tokenizer.encode("STOP", add_special_tokens=False))
    out = OutputText(tokenizer, [], stops=("STOP",), min_tokens=first_stop_end + 1)
    for t in ids:
        if out.add_tokens([t]).stop_string:
            break
    assert out.stopped and out.text == "STOP Hello "


def test_output_text_finish_releases_partial_stop(tokenizer):
    out = OutputText(tokenizer, [], stops=("world!",))
    out.add_tokens(tokenizer.encode("Hello world", add_special_tokens=False))
    assert out.text == "Hello "
    assert out.finish().text == "world"
    assert out.text == "Hello world" and not out.stopped
