"""``resolve_model``: a model name or directory -> the directory to load, prepared on demand.

The one resolver every command and server uses (``--model default``, a shipped variant's name,
``gemma-3-270m``, or a Hugging Face directory). It sits above the writers it may call
(``prepare`` for the default model, ``prepare_gemma``, ``shipped`` for the variants), which take
directories and never resolve names themselves, so the import graph has no circle:
``models`` -> ``shipped`` -> ``swiftkv``/``zack`` -> (nothing above). Errors are ``PrepareError``.
"""

from __future__ import annotations

from pathlib import Path

from modelkit import prepare_gemma, shipped
from modelkit.prepare import DEFAULT_MODEL_NAME, PrepareError, ensure_default_model
from swiftcommon import envs


def resolve_model(name_or_path: str | Path) -> Path:
    """'default' / 'SmolLM2-135M-Instruct' (any case) -> the prepared directory (prepared on demand);
    a named shipped variant (see modelkit.shipped) -> its directory; otherwise an HF directory."""
    name = str(name_or_path)
    if name.lower() in ("default", DEFAULT_MODEL_NAME.lower()):
        return ensure_default_model()
    if name.lower() == prepare_gemma.NAME:        # opt-in (licence): never downloaded here
        if not prepare_gemma.is_prepared(envs.cache_dir()):
            raise PrepareError(f"{prepare_gemma.NAME} is not prepared; run `modelkit prepare --model "
                               f"{prepare_gemma.NAME} --accept-license` first (Gemma Terms of Use)")
        return prepare_gemma.model_dir(envs.cache_dir())
    if shipped.is_shipped(name):
        return shipped.materialize(name)
    path = Path(name).expanduser()
    known = ", ".join(["default", DEFAULT_MODEL_NAME, prepare_gemma.NAME, *shipped.names()])
    if not path.is_dir():
        raise PrepareError(f"model {name!r} is neither a known name ({known}) nor an existing directory")
    if not (path / "config.json").is_file():
        raise PrepareError(f"model directory {path} has no config.json (expected a Hugging Face model directory)")
    return path
