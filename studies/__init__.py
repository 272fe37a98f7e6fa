"""One-off studies: comparisons run once to answer a question (lab tooling, not in the wheel).

Each runs from the checkout as ``python -m studies.<name>``; it may import any product package.
"""
