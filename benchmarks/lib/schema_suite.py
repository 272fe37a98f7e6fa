"""A suite of varied JSON schemas (with a prompt each) for structured-output benchmarks.

``suite()`` returns 60+ ``Case(name, schema, prompt)``: 12 entities (flat objects with
strings, integers and numbers with bounds, booleans, enums, arrays, nested objects) in 5
shapes each: as is, with optional fields, wrapped with a bounded confidence, a bounded
list of them, and through ``$defs``/``$ref``; plus a few with ``anyOf``, nullable types,
``const`` and ``pattern``. ``instance(schema)`` builds one valid instance of a schema
(properties in schema order, every optional one included), which the grammar-backend
benchmark feeds token by token through each library's matcher.

Used by studies/structured_backends.py (mask time and coverage per library) and
benchmarks/quality/api_structured.py (share of model outputs that parse and validate).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    schema: dict
    prompt: str


def _s(max_len: int | None = 40) -> dict:
    return {"type": "string", "maxLength": max_len} if max_len else {"type": "string"}


def _bounded(kind: str, lo=None, hi=None) -> dict:
    d = {"type": kind}
    if lo is not None:
        d["minimum"] = lo
    if hi is not None:
        d["maximum"] = hi
    return d


def _int(lo=None, hi=None) -> dict:
    return _bounded("integer", lo, hi)


def _num(lo=None, hi=None) -> dict:
    return _bounded("number", lo, hi)


def _enum(*values) -> dict:
    return {"type": "string", "enum": list(values)}


def _arr(items: dict, lo: int = 0, hi: int = 4) -> dict:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


def _obj(props: dict, optional: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": props, "required": [k for k in props if k not in optional],
            "additionalProperties": False}


# entity name -> (description for the prompt, properties, names that may be optional)
ENTITIES: dict[str, tuple[str, dict, tuple[str, ...]]] = {
    "person": ("a fictional person", {"name": _s(), "age": _int(0, 120), "email": _s(60), "is_student": {"type": "boolean"}},
               ("email", "is_student")),
    "product": ("a product in an online shop", {"title": _s(), "price": _num(0, 10000), "in_stock": {"type": "boolean"},
                                                 "tags": _arr(_s(20), 0, 4)}, ("tags",)),
    "city": ("a city", {"name": _s(), "country": _s(), "population": _int(0), "capital": {"type": "boolean"}},
             ("capital",)),
    "book": ("a book", {"title": _s(60), "author": _s(), "year": _int(1450, 2030),
                        "genre": _enum("fiction", "science", "history", "poetry")}, ("genre",)),
    "weather": ("the weather in a city", {"city": _s(), "temperature": _num(-50, 60),
                                          "unit": _enum("celsius", "fahrenheit"),
                                          "conditions": _enum("sunny", "cloudy", "rain", "snow")}, ("conditions",)),
    "event": ("a public event", {"name": _s(), "day": _int(1, 31), "month": _int(1, 12),
                                 "speakers": _arr(_obj({"name": _s(), "topic": _s()}), 1, 3)}, ("speakers",)),
    "order": ("a customer order", {"order_id": _int(1), "items": _arr(_obj({"sku": _s(12), "qty": _int(1, 100)}), 1, 3),
                                   "total": _num(0), "paid": {"type": "boolean"}}, ("paid",)),
    "movie": ("a movie", {"title": _s(), "year": _int(1900, 2030), "rating": _num(0, 10),
                          "cast": _arr(_s(), 1, 4)}, ("cast",)),
    "recipe": ("a recipe", {"name": _s(), "servings": _int(1, 12),
                            "ingredients": _arr(_obj({"item": _s(), "grams": _int(1, 5000)}), 1, 4),
                            "vegetarian": {"type": "boolean"}}, ("vegetarian",)),
    "company": ("a company", {"name": _s(), "founded": _int(1800, 2030), "employees": _int(1),
                              "address": _obj({"street": _s(), "city": _s(), "zip": _s(10)})}, ("address",)),
    "song": ("a song", {"title": _s(), "artist": _s(), "seconds": _int(30, 900), "explicit": {"type": "boolean"}},
             ("explicit",)),
    "car": ("a car", {"make": _enum("toyota", "ford", "bmw", "tesla", "fiat"), "model": _s(), "year": _int(1950, 2030),
                      "electric": {"type": "boolean"}, "price": _num(0, 500000)}, ("price",)),
}


def _shapes(name: str, desc: str, props: dict, optional: tuple[str, ...]) -> list[Case]:
    flat = _obj(props)
    opt = _obj(props, optional)
    wrapped = _obj({"result": _obj(props), "confidence": _num(0, 1)})
    listed = _obj({"items": _arr(_obj(props), 1, 3)})
    refd = {"$defs": {name: _obj(props)}, **_obj({"first": {"$ref": f"#/$defs/{name}"},
                                                   "second": {"$ref": f"#/$defs/{name}"}})}
    return [
        Case(f"{name}", flat, f"Describe {desc} as JSON."),
        Case(f"{name}_optional", opt, f"Describe {desc} as JSON; leave out what you do not know."),
        Case(f"{name}_wrapped", wrapped, f"Describe {desc} as JSON, with your confidence between 0 and 1."),
        Case(f"{name}_list", listed, f"List one to three examples of {desc} as JSON."),
        Case(f"{name}_refs", refd, f"Give two examples of {desc} as JSON."),
    ]


def _extra() -> list[Case]:
    return [
        Case("contact_anyof", _obj({"contact": {"anyOf": [_obj({"email": _s(60)}), _obj({"phone": _s(20)})]}}),
             "Give a way to contact a support team as JSON."),
        Case("nullable_middle_name", _obj({"first": _s(), "middle": {"type": ["string", "null"], "maxLength": 30},
                                           "last": _s()}), "Give a person's full name as JSON."),
        Case("const_version", _obj({"version": {"const": "1.0"}, "status": _enum("ok", "degraded", "down")}),
             "Report a service status as JSON."),
        Case("zip_pattern", _obj({"city": _s(), "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}),
             "Give a US city and its zip code as JSON."),
        Case("matrix", _obj({"rows": _arr(_arr(_int(0, 9), 2, 2), 2, 2)}), "Give a 2x2 matrix of digits as JSON."),
        Case("deep_nesting", _obj({"a": _obj({"b": _obj({"c": _obj({"value": _int(0, 100)})})})}),
             "Give a deeply nested JSON object with a number inside."),
    ]


def suite() -> list[Case]:
    cases = []
    for name, (desc, props, optional) in ENTITIES.items():
        cases += _shapes(name, desc, props, optional)
    return cases + _extra()


# ---- one valid instance of a schema (for feeding matchers token by token) ------------------------
def instance(schema: dict, root: dict | None = None):
    root = root or schema
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part]
        return instance(target, root)
    if "const" in schema:
        return copy.deepcopy(schema["const"])
    if "enum" in schema:
        return schema["enum"][-1]
    if "anyOf" in schema:
        return instance(schema["anyOf"][0], root)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = kind[0]
    if kind == "object":
        return {k: instance(v, root) for k, v in schema.get("properties", {}).items()}
    if kind == "array":
        return [instance(schema["items"], root) for _ in range(max(1, schema.get("minItems", 0)))]
    if kind == "string":
        if schema.get("pattern") == "^[0-9]{5}$":
            return "90210"
        return "Ada Lovelace"[: schema.get("maxLength", 40)]
    if kind == "integer":
        return int(schema.get("minimum", 0)) + 1          # every bounded range here spans more than one
    if kind == "number":
        lo = schema.get("minimum", 0)
        hi = schema.get("maximum", lo + 10)
        return round((lo + hi) / 2 + 0.25, 2)
    if kind == "boolean":
        return True
    return None
