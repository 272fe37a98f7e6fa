"""Aliases and splits as pure functions: flag and file parsing with clear refusals, the split ratio,
stickiness (a key keeps its variant, a weight change moves only the keys between the old and the
new boundary, an unavailable target moves only its own keys), and the model directory's pools."""

import random

import pytest

from gateway.aliases import AliasTable, build_alias, parse_alias_flag, pick, read_aliases
from gateway.discovery import WorkerPool
from gateway.pools import ModelDirectory


def test_flag_parsing_and_refusals():
    a = parse_alias_flag("smol=orig:90,fast:10")
    assert a.name == "smol" and a.targets == (("orig", 90.0), ("fast", 10.0)) and a.shadow is None
    assert a.weights == {"orig": 0.9, "fast": 0.1}
    assert parse_alias_flag("x=only").targets == (("only", 1.0),)
    shadowed = parse_alias_flag("smol=orig:90,fast:10", default_fraction=0.25).shadow
    assert shadowed.reference == "orig" and shadowed.models == ("fast",) and shadowed.fraction == 0.25
    for bad, why in (("smol", "NAME=MODEL"), ("smol=a:x", "not a number"), ("smol=a:-1", ">= 0"),
                     ("smol=a:0", "add up to 0"), ("smol=a,a", "twice"), ("=a", "non-empty name"),
                     ("smol=", "no target")):
        with pytest.raises(ValueError, match=why):
            parse_alias_flag(bad)


def test_file_parsing(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("aliases:\n  smol:\n    targets: {orig: 8, v13: 1, v50: 1}\n"
                 "    shadow: {reference: orig, fraction: 0.5, models: [orig, v50]}\n")
    (a,) = read_aliases(f).values()
    assert a.shadow.models == ("orig", "v50") and a.shadow.fraction == 0.5
    for text, why in (("aliases: [1]", "mapping"), ("aliases:\n  s: {targets: {a: 1}, extra: 1}", "targets"),
                      ("aliases:\n  s: {targets: {a: 1, b: 1}, shadow: {fraction: 2}}", "between 0 and 1"),
                      ("aliases:\n  s: {targets: {a: 1, b: 1}, shadow: {models: [c], fraction: 1}}", "not targets"),
                      ("aliases:\n  s: {targets: {a: 1, b: 1}, shadow: {}}", "shadow.fraction"),
                      ("aliases: {s: [", "not YAML")):
        f.write_text(text)
        with pytest.raises(ValueError, match=why):
            read_aliases(f)


def test_table_reload_keeps_the_old_table_on_a_bad_file(tmp_path):
    f = tmp_path / "m.yaml"
    f.write_text("aliases:\n  smol: {targets: {a: 1}}\n")
    table = AliasTable([parse_alias_flag("smol=z"), parse_alias_flag("other=b")], str(f))
    assert table.get("smol").targets == (("a", 1.0),) and table.get("other") is not None   # the file wins
    f.write_text("aliases:\n  smol: {targets: {}}\n")
    assert table.reload() is False and table.get("smol").targets == (("a", 1.0),)
    f.write_text("aliases:\n  smol: {targets: {b: 2}}\n")
    import os
    os.utime(f, ns=(1, 10**18))                 # a distinct mtime even within one clock tick
    assert table.reload() is True and table.get("smol").targets == (("b", 2.0),)


def test_split_ratio_and_stickiness():
    a = build_alias("smol", {"orig": 90, "fast": 10})
    both = {"orig", "fast"}
    keys = [f"user-{i}" for i in range(20000)]
    picks = {k: pick(a, k, both, random.Random(0)) for k in keys}
    share = sum(v == "fast" for v in picks.values()) / len(keys)
    assert abs(share - 0.10) < 0.01
    assert all(pick(a, k, both, random.Random(1)) == picks[k] for k in keys[:500])      # sticky
    unkeyed = [pick(a, None, both, random.Random(i)) for i in range(4000)]
    assert abs(unkeyed.count("fast") / 4000 - 0.10) < 0.02
    # 90/10 -> 80/20 moves only the keys between 0.8 and 0.9: about 10%, all of them orig -> fast
    b = build_alias("smol", {"orig": 80, "fast": 20})
    moved = [k for k in keys if pick(b, k, both, random.Random(0)) != picks[k]]
    assert abs(len(moved) / len(keys) - 0.10) < 0.01 and all(picks[k] == "orig" for k in moved)
    # a target without workers: its keys go elsewhere, the others stay
    three = build_alias("smol", {"orig": 1, "fast": 1, "other": 1})
    full = {k: pick(three, k, {"orig", "fast", "other"}, random.Random(0)) for k in keys[:3000]}
    part = {k: pick(three, k, {"orig", "fast"}, random.Random(0)) for k in keys[:3000]}
    assert all(part[k] == full[k] for k in full if full[k] != "other")
    assert pick(three, "k", set(), random.Random(0)) is None


def test_directory_pools_follow_the_workers():
    pool = WorkerPool(["http://a", "http://b", "http://c"])
    d = ModelDirectory(pool)
    wa, wb, wc = (pool.workers[u] for u in ("http://a", "http://b", "http://c"))
    assert d.unknown() and list(d.of("x")) == []
    wa.models, wa.model_cards = ("x",), ({"id": "x"},)
    wb.models, wb.model_cards = ("y", "x"), ({"id": "y"}, {"id": "x", "from": "b"})
    wc.models = ()
    assert sorted(w.url for w in d.of("x")) == ["http://a", "http://b"] and len(d.of("y")) == 1
    assert sorted(d.served(0.0)) == ["x", "y"] and not d.unknown()
    assert sorted(c["id"] for c in d.cards(0.0)) == ["x", "y"]          # each model once
    wa.healthy = False
    assert d.served(0.0) == ["y", "x"] and d.cards(0.0)[0] == {"id": "x", "from": "b"} and d.known() == {"x", "y"}
    wb.models = ("z",)                          # changed model: leaves the pool at once
    assert list(d.of("x")) == [wa]
