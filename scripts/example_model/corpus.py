"""Step 1: extract a training corpus from the Python standard library's own docstrings.

The text is the docstrings of a fixed, sorted list of standard-library modules
of *this* Python installation (Python Software Foundation License; see
https://docs.python.org/3/license.html). Nothing is downloaded. Extraction is
deterministic for a given Python build: modules in sorted order, members in
sorted name order, docstrings cleaned with :func:`inspect.cleandoc`.

Every documented object becomes one chat exchange (a user question about the
object, the docstring as the answer), so the model learns the chat template
and to end its answer with ``<|im_end|>``. The exchanges are written as JSON
Lines (``{"role_user": ..., "role_assistant": ..., "kind": ...}``) beside a
small manifest with the Python version, the module list and a sha256.

Run alone: ``python scripts/example_model/corpus.py OUT_DIR``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import sys
import warnings
from pathlib import Path

#: Modules whose docstrings form the corpus: pure-Python or built-in, importable without side effects
#: (no GUI, no network, no printing on import). Sorted; the order is part of the recipe.
MODULES: tuple[str, ...] = tuple(sorted((
    "abc", "argparse", "array", "ast", "asyncio", "base64", "bisect", "builtins", "bz2", "calendar", "cmath",
    "codecs", "collections", "collections.abc", "colorsys", "concurrent.futures", "configparser", "contextlib",
    "contextvars", "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "dis", "email", "enum",
    "filecmp", "fnmatch", "fractions", "ftplib", "functools", "gc", "getopt", "gettext", "glob", "graphlib",
    "gzip", "hashlib", "heapq", "hmac", "html", "html.parser", "http", "http.client", "imaplib", "importlib",
    "inspect", "io", "ipaddress", "itertools", "json", "keyword", "linecache", "locale", "logging",
    "logging.handlers", "lzma", "math", "mimetypes", "multiprocessing", "numbers", "operator", "optparse", "os",
    "os.path", "pathlib", "pickle", "pkgutil", "platform", "plistlib", "pprint", "queue", "random", "re",
    "reprlib", "sched", "secrets", "selectors", "shelve", "shlex", "shutil", "signal", "smtplib", "socket",
    "sqlite3", "ssl", "statistics", "string", "struct", "subprocess", "sys", "tarfile", "tempfile", "textwrap",
    "threading", "time", "timeit", "tokenize", "tomllib", "traceback", "types", "typing", "unicodedata",
    "unittest", "unittest.mock", "urllib.parse", "urllib.request", "uuid", "warnings", "weakref",
    "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zlib", "zoneinfo",
)))

#: Question templates per kind of object; the template is picked by a hash of the object's name,
#: so the choice is deterministic and independent of iteration order.
QUESTIONS: dict[str, tuple[str, ...]] = {
    "module": ("Explain the {name} module.", "What is the {name} module for?",
               "Summarize the documentation of the {name} module."),
    "class": ("Explain the class {name}.", "What does {name} represent?", "Describe {name}."),
    "function": ("Explain {name}.", "What does {name} do?", "How do I use {name}?"),
    "signature": ("Write the call signature of {name}.", "Show how to call {name}."),
    "members": ("List the public functions of the {name} module.", "List the methods of {name}."),
}
MAX_ANSWER_CHARS = 1200  # long docstrings are cut at a paragraph boundary below this length


def _pick(kind: str, name: str) -> str:
    options = QUESTIONS[kind]
    h = int(hashlib.sha256(f"{kind}:{name}".encode()).hexdigest(), 16)
    return options[h % len(options)].format(name=name)


def _clip(text: str) -> str:
    if len(text) <= MAX_ANSWER_CHARS:
        return text
    cut = text.rfind("\n\n", 0, MAX_ANSWER_CHARS)
    if cut < 200:
        cut = text.rfind("\n", 0, MAX_ANSWER_CHARS)
    return text[: cut if cut > 200 else MAX_ANSWER_CHARS].rstrip()


def _doc(obj: object) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or len(doc.strip()) < 20:
        return None
    return _clip(inspect.cleandoc(doc))


def _signature(obj: object) -> str | None:
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    # Defaults shown by memory address (``<object at 0x7f..>``) would differ between runs: skip them.
    return None if re.search(r" at 0x[0-9a-fA-F]+", sig) else sig


def _public(names: list[str]) -> list[str]:
    return sorted(n for n in names if not n.startswith("_"))


def iter_exchanges(modules: tuple[str, ...] = MODULES):
    """Yield ``{"kind", "user", "assistant"}`` dicts, deterministically ordered."""
    for mod_name in modules:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(mod_name)
        doc = _doc(module)
        if doc:
            yield {"kind": "module", "user": _pick("module", mod_name), "assistant": doc}
        names = getattr(module, "__all__", None)
        names = _public(list(names) if isinstance(names, (list, tuple)) else dir(module))
        funcs: list[str] = []
        for name in names:
            obj = getattr(module, name, None)
            if obj is None or inspect.ismodule(obj):
                continue
            # Only objects defined in (or re-exported by) this module's own package, not typing helpers etc.
            owner = getattr(obj, "__module__", None) or ""
            if not (owner == mod_name or owner.split(".")[0] == mod_name.split(".")[0]
                    or owner.lstrip("_") == mod_name or mod_name == "builtins"):
                continue
            qual = f"{mod_name}.{name}"
            if inspect.isclass(obj):
                cdoc = _doc(obj)
                if cdoc:
                    yield {"kind": "class", "user": _pick("class", qual), "assistant": cdoc}
                methods = []
                for meth_name in _public(list(vars(obj))):
                    meth = vars(obj)[meth_name]
                    if callable(meth) or isinstance(meth, (classmethod, staticmethod, property)):
                        methods.append(meth_name)
                        mdoc = _doc(meth)
                        if mdoc:
                            yield {"kind": "function", "user": _pick("function", f"{qual}.{meth_name}"),
                                   "assistant": mdoc}
                if len(methods) >= 2:
                    yield {"kind": "members", "user": f"List the methods of {qual}.",
                           "assistant": "\n".join(f"- {m}" for m in methods[:24])}
            elif callable(obj):
                fdoc = _doc(obj)
                if fdoc:
                    funcs.append(name)
                    yield {"kind": "function", "user": _pick("function", qual), "assistant": fdoc}
                sig = _signature(obj)
                if sig is not None and fdoc:
                    yield {"kind": "signature", "user": _pick("signature", qual),
                           "assistant": f"```python\n{qual}{sig}\n```"}
        if len(funcs) >= 2:
            yield {"kind": "members", "user": f"List the public functions of the {mod_name} module.",
                   "assistant": "\n".join(f"- {mod_name}.{f}" for f in funcs[:24])}


def extract(out_dir: Path) -> dict:
    """Write ``corpus.jsonl`` and ``corpus_manifest.json`` into ``out_dir``; return the manifest."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "corpus.jsonl"
    digest = hashlib.sha256()
    n = chars = 0
    seen: set[tuple[str, str]] = set()
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for ex in iter_exchanges():
            key = (ex["user"], ex["assistant"])
            if key in seen:  # aliases (e.g. os.path in os) repeat a docstring verbatim
                continue
            seen.add(key)
            line = json.dumps(ex, ensure_ascii=False, sort_keys=True) + "\n"
            fh.write(line)
            digest.update(line.encode())
            n += 1
            chars += len(ex["user"]) + len(ex["assistant"])
    tmp.replace(path)
    manifest = {"python": sys.version, "modules": list(MODULES), "n_exchanges": n, "n_chars": chars,
                "sha256": digest.hexdigest(), "licence": "Python Software Foundation License (docstrings of "
                "the Python standard library)"}
    (out_dir / "corpus_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


if __name__ == "__main__":
    m = extract(Path(sys.argv[1] if len(sys.argv) > 1 else "models/work"))
    print(json.dumps({k: v for k, v in m.items() if k != "modules"}))
