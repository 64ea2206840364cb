"""Where the example model lives: the shipped copy in the package, else ``models/example-moe``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import ValidationError

__all__ = ["example_model_dir", "example_prompts", "EXAMPLE_WEIGHTS_SHA256"]

#: sha256 of the example model's ``model.safetensors`` as ``scripts/example_model/make_all.py`` builds it
#: (docs/example_model.md); the shipped copy must be that file byte for byte.
EXAMPLE_WEIGHTS_SHA256 = "871516e485bf7e73d0cbd48df88baca78dd418a03b6c3463692f209e87eb18dc"


def example_model_dir() -> Path:
    """The example model directory (weights, config, tokenizer).

    Raises
    ------
    ValidationError
        Neither the packaged copy nor a rebuilt ``models/example-moe`` exists.
    """
    shipped = Path(str(resources.files("expertcache") / "data" / "example_model"))
    if (shipped / "model.safetensors").is_file():
        return shipped
    local = Path("models") / "example-moe"
    if (local / "model.safetensors").is_file():
        return local
    raise ValidationError("the example model is not installed: rebuild it with "
                          "python scripts/example_model/make_all.py (docs/example_model.md)", field="model")


def example_prompts() -> Path:
    """The bundled example prompt set."""
    return Path(str(resources.files("expertcache") / "data" / "example_prompts.jsonl"))
