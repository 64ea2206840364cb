"""Surface-text measures shared by the builder and the prompt-side diagnostics (§5.6, B1).

A text's *5-grams* are the set of 5 consecutive word tokens, where a token is a
maximal run of Unicode word characters (``\\w+``) of the lower-cased text; a text
with fewer than five tokens has one gram, its whole token sequence (none if it
has no token). The Jaccard index of two gram sets is ``|A & B| / |A | B|``,
0 when both are empty.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["ngrams", "jaccard", "mean_pairwise_jaccard", "prompt_head", "final_line", "HEAD_CHARS", "NGRAM"]

#: Gram length of the payload filter and the prompt diagnostic.
NGRAM = 5
#: Characters of a prompt's head (§5.6: "distinct 70-character prompt heads").
HEAD_CHARS = 70
_WORD = re.compile(r"\w+")


def ngrams(text: str, n: int = NGRAM) -> frozenset[tuple[str, ...]]:
    """Word ``n``-grams of ``text`` (see the module docstring).

    >>> sorted(ngrams("a b c", n=2))
    [('a', 'b'), ('b', 'c')]
    >>> sorted(ngrams("A b", n=5))
    [('a', 'b')]
    """
    tokens = _WORD.findall(text.lower())
    if not tokens:
        return frozenset()
    if len(tokens) < n:
        return frozenset({tuple(tokens)})
    return frozenset(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def jaccard(a: frozenset, b: frozenset) -> float:
    """``|a & b| / |a | b|`` (0 when both are empty)."""
    if not a and not b:
        return 0.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def mean_pairwise_jaccard(texts: Sequence[str], n: int = NGRAM) -> float | None:
    """Mean 5-gram Jaccard over all unordered pairs of ``texts`` (``None`` for fewer than two)."""
    grams = [ngrams(t, n) for t in texts]
    total, pairs = 0.0, 0
    for i in range(len(grams)):
        for j in range(i + 1, len(grams)):
            total += jaccard(grams[i], grams[j])
            pairs += 1
    return total / pairs if pairs else None


def prompt_head(prompt: str, chars: int = HEAD_CHARS) -> str:
    """The first ``chars`` characters of a prompt."""
    return prompt[:chars]


def final_line(prompt: str) -> str:
    """The last non-blank line of a prompt, stripped of surrounding white space."""
    for line in reversed(prompt.splitlines()):
        if line.strip():
            return line.strip()
    return ""
