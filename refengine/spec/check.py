"""Which settings speculative decoding composes with, checked once where an engine is configured. No torch.

Verification runs a request's draft as decode rows (``refengine.model_runner``): every row is what
a plain decode step of that token would compute, through every KV method's decode path, and the
KV written for rejected drafts is overwritten before any query reads it. That holds for a method
whose state after a step depends only on the tokens kept. A method that learns from every query
row it sees (ZipCache's saliency, summed from each decode row's attention) would learn from rows
that are then thrown away, so its cache, and its outputs, would differ from the same requests
without speculation: such a method is refused by name (``REFUSED``), never run silently different.
"""

from __future__ import annotations

from refengine.spec.config import SpecConfig

REFUSED = {
    "zipcache": "ZipCache ranks tokens by the attention of every decode row it sees; the rows of rejected "
                "drafts would change which tokens it keeps at high precision, so outputs would differ from "
                "the same requests without speculation",
}


def refusals(kv_method_names) -> list[str]:
    """The reasons speculative decoding cannot run with these KV methods (empty: it composes)."""
    return [f"speculative decoding cannot be combined with the KV method {name!r}: {REFUSED[name]}"
            for name in kv_method_names if name in REFUSED]


def check_speculation(spec: SpecConfig | None, kv_methods) -> None:
    """ValueError naming every KV method (objects with ``.name``, or names) that cannot verify drafts."""
    if spec is None:
        return
    reasons = refusals([getattr(m, "name", m) for m in kv_methods])
    if reasons:
        raise ValueError("; ".join(reasons))
