"""Where the example model lives: a packaged copy (none is shipped yet), else ``models/example-moe``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from ..errors import ValidationError

__all__ = ["example_model_dir", "example_prompts"]


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
