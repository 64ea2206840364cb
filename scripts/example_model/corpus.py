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

Independent of what else is installed or imported: the extraction runs in a child interpreter
started ``-I -S`` (no site-packages, no ``.pth`` files, no ``PYTHON*`` variables, nothing imported
but the modules below, in this order), which then installs the interactive builtins ``site``
normally adds (``help``, ``copyright``, ``credits``, ``license``, ``exit``, ``quit``) itself, so
they are always in the corpus. Two things used to leak into the text: packages imported first
(torch replaces ``inspect.getfile``, transformers adds ``warning_once`` and friends to
``logging.Logger``) and the interpreter's path (the default of ``platform.architecture``'s
``executable``). The first cannot happen in the child; the second is written as :data:`EXECUTABLE`
whatever interpreter runs. ``corpus_sha256.json`` beside this file holds the documented corpus's
sha256 and one sha256 per module; :func:`extract` names every module whose text deviates.

Run alone: ``python scripts/example_model/corpus.py OUT_DIR``.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

#: The interpreter path written wherever a signature's default is the running interpreter
#: (``platform.architecture(executable=sys.executable)``): the path of the interpreter that extracted
#: the documented corpus (docs/example_model.md), so every interpreter reproduces it byte for byte.
EXECUTABLE = "/work/venv/bin/python"
#: The documented corpus: its sha256, the Python build it was made with, and a sha256 per module.
RECIPE = Path(__file__).resolve().with_name("corpus_sha256.json")

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
    if re.search(r" at 0x[0-9a-fA-F]+", sig):
        return None
    return sig.replace(repr(sys.executable), repr(EXECUTABLE))


def _public(names: list[str]) -> list[str]:
    return sorted(n for n in names if not n.startswith("_"))


def iter_exchanges(modules: tuple[str, ...] = MODULES):
    """Yield ``(module, {"kind", "user", "assistant"})``, deterministically ordered.

    The text depends on what the interpreter has imported and on ``builtins``; :func:`extract`
    therefore calls this only in an isolated child (:func:`_child_exchanges`).
    """
    for mod_name in modules:
        for ex in _module_exchanges(mod_name):
            yield mod_name, ex


def _module_exchanges(mod_name: str):
    """The exchanges of one module, in order (before de-duplication)."""
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


def _install_site_builtins() -> None:
    """The builtins ``site`` adds at start-up (``python -S`` skips them), added explicitly."""
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()


def _child_exchanges() -> list[tuple[str, dict]]:
    """Run the extraction in ``sys.executable -I -S`` and read its ``(module, exchange)`` lines."""
    p = subprocess.run([sys.executable, "-I", "-S", str(Path(__file__).resolve()), "--emit"],
                       capture_output=True, text=True, encoding="utf-8", check=False)
    if p.returncode != 0:
        raise RuntimeError(f"corpus extraction failed in the isolated interpreter:\n{p.stderr}")
    return [tuple(json.loads(line)) for line in p.stdout.splitlines()]


def deviations(per_module: dict[str, str], recipe: dict) -> list[str]:
    """Modules whose sha256 differs from the recipe's (or that only one side has), sorted."""
    want = recipe.get("modules", {})
    return sorted(m for m in set(per_module) | set(want) if per_module.get(m) != want.get(m))


def extract(out_dir: Path) -> dict:
    """Write ``corpus.jsonl`` and ``corpus_manifest.json`` into ``out_dir``; return the manifest.

    The manifest's ``deviations`` lists the modules whose text differs from the documented corpus
    (``corpus_sha256.json``); empty when the corpus is the documented one byte for byte.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "corpus.jsonl"
    digest = hashlib.sha256()
    per_module: dict[str, hashlib._Hash] = {m: hashlib.sha256() for m in MODULES}
    n = chars = 0
    seen: set[tuple[str, str]] = set()
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for mod_name, ex in _child_exchanges():
            key = (ex["user"], ex["assistant"])
            if key in seen:  # aliases (e.g. os.path in os) repeat a docstring verbatim
                continue
            seen.add(key)
            line = json.dumps(ex, ensure_ascii=False, sort_keys=True) + "\n"
            fh.write(line)
            digest.update(line.encode())
            per_module[mod_name].update(line.encode())
            n += 1
            chars += len(ex["user"]) + len(ex["assistant"])
    tmp.replace(path)
    modules = {m: h.hexdigest() for m, h in per_module.items()}
    recipe = json.loads(RECIPE.read_text()) if RECIPE.is_file() else {}
    manifest = {"python": sys.version, "modules": list(MODULES), "n_exchanges": n, "n_chars": chars,
                "sha256": digest.hexdigest(), "module_sha256": modules,
                "documented_sha256": recipe.get("sha256"), "deviations": deviations(modules, recipe),
                "licence": "Python Software Foundation License (docstrings of the Python standard library)"}
    (out_dir / "corpus_manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _emit() -> None:
    """Child side: print one ``[module, exchange]`` JSON line per exchange (isolated interpreter)."""
    _install_site_builtins()
    out = sys.stdout
    for mod_name, ex in iter_exchanges():
        out.write(json.dumps([mod_name, ex], ensure_ascii=False) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--emit"]:
        sys.stdout.reconfigure(encoding="utf-8")
        _emit()
        sys.exit(0)
    m = extract(Path(sys.argv[1] if len(sys.argv) > 1 else "models/work"))
    print(json.dumps({k: v for k, v in m.items() if k not in ("modules", "module_sha256")}))
