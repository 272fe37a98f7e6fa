"""``StructuredSpec`` -> an llguidance grammar, and the check that names what it cannot do. No torch.

Why llguidance (docs/structured-outputs.md, measured with studies/structured_backends.py
on the 66-schema suite): all three candidate libraries cover the suite and mask a token in
microseconds, but llguidance compiles a schema in ~0.5 ms against ~290 ms (xgrammar) and
~540 ms (outlines-core), which precompute per-schema tables over the vocabulary; it refuses
an unimplemented keyword with an error naming it (``lenient`` off), which our 400s need;
and it reads JSON schemas, regexes, Lark and GBNF, so one library serves every constraint.

JSON is generated compact (no whitespace between tokens) unless the request gives a
``whitespace_pattern``: a small model offered free whitespace can spend its whole
budget on newlines. ``check`` needs no tokenizer (it names unsupported schema keywords);
``compile_check`` goes on as the engine will: it builds the matcher against the model's
tokenizer and computes the first token mask, which is where most hostile constraints fail
(a rule that only refers to itself, a schema ``{"$ref": "#"}``, a regex too large for the
lexer). The worker runs it at the HTTP edge, in a child process with a time limit
(``worker.constraints``), so the engine never sees a constraint that did not compile.
Both sides use the same parser limits (``parser_limits``: llguidance's defaults, without
verbose errors). Messages are ``tidy``: no parser state, no Rust backtrace.
"""

from __future__ import annotations

import json

from refengine.structured.spec import StructuredSpec


class GrammarError(ValueError):
    """The constraint cannot be compiled, or failed while masking; the message says why (and names
    unsupported features). ``request_id``: the request whose constraint failed, when known (the
    engine then fails it alone, without running the rest of its batch one request at a time)."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message)
        self.request_id = request_id


def to_grammar(spec: StructuredSpec) -> str:
    """The llguidance grammar (its JSON form) for ``spec``; GrammarError for malformed input."""
    import llguidance

    M = llguidance.LLMatcher
    if spec.kind == "json":
        opts = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":", "lenient": False}
        if spec.whitespace_pattern is not None:
            opts |= {"whitespace_flexible": True, "whitespace_pattern": spec.whitespace_pattern}
        try:
            # overrides, not defaults: a schema's own "x-guidance" options must not turn lenient on.
            return M.grammar_from_json_schema(spec.text, overrides=opts)
        except ValueError as exc:
            raise GrammarError(f"not a JSON schema: {exc}") from None
    if spec.kind == "regex":
        return M.grammar_from_regex(spec.text)
    if spec.kind == "choice":
        choices = json.loads(spec.text)
        # JSON string literals are Lark string literals (same escapes).
        return M.grammar_from_lark("start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices))
    if spec.kind == "lark":
        return M.grammar_from_lark(spec.text)
    if spec.kind == "grammar":
        from llguidance.gbnf_to_lark import any_to_lark

        try:
            return M.grammar_from_lark(any_to_lark(spec.text))     # GBNF ("::=") or Lark, as vLLM takes both
        except Exception as exc:  # noqa: BLE001 - the converter raises its own types
            raise GrammarError(f"could not read the grammar (GBNF or Lark): {exc}") from None
    raise GrammarError(f"unknown constraint kind {spec.kind!r}")


def parser_limits():
    """llguidance's resource limits for every matcher (edge and engine): its defaults bound each mask's
    work (lexer fuel, Earley items); verbose errors off (they dump the parser state)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


def check(spec: StructuredSpec) -> str:
    """Compile ``spec`` without a tokenizer; returns the grammar or raises GrammarError with
    llguidance's message (for a JSON schema it names the unsupported keywords)."""
    grammar = to_grammar(spec)
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None)
    if is_error:
        raise GrammarError(tidy(messages[0] if messages else "invalid grammar"))
    return grammar


_STOPPED = {"NoExtension": "the constraint allows no output at all (for example a rule that only refers to "
                           "itself, or a schema that only references itself)",
            "NoExtensionBias": "the constraint allows no output at all (for example a rule that only refers to "
                               "itself, or a schema that only references itself)",
            "LexerTooComplex": "the constraint is too complex for the grammar library's lexer limits",
            "ParserTooComplex": "the constraint is too complex for the grammar library's parser limits"}


def compile_check(spec: StructuredSpec, tokenizer) -> None:
    """Compile ``spec`` against ``tokenizer`` (an ``llguidance.LLTokenizer``) and compute its first
    mask, as the engine will; GrammarError with a tidy message when it cannot be used."""
    import llguidance

    grammar = check(spec)
    m = llguidance.LLMatcher(tokenizer, grammar, log_level=0, limits=parser_limits())
    if not m.is_error():
        m.compute_bitmask()
    if m.is_error() or m.is_stopped() and not m.is_accepting():
        raise GrammarError(_STOPPED.get(str(m.stop_reason())) or tidy(m.get_error()) or "the constraint cannot be used")


def tidy(message: str) -> str:
    """llguidance's message without its internals: the text before a parser-state dump or a
    backtrace, at most three lines; a panic of the library is named as such."""
    for marker in ("<state>", "<backtrace>", "stack backtrace:", "<non-verbose/>"):
        message = message.split(marker, 1)[0]
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    text = " ".join(lines[:3])[:400]
    if text.startswith("panic"):
        return "the constraint is too large or too complex for the grammar library"
    return _STOPPED.get(text, text)
