"""Naive twin of ``expertcache.replay.proactive``, written from docs/prefetch.md alone.

Python sets, dicts and ``sorted()``; no numba, no incremental structures.
Reads only the public arrays of an ``EventStream`` and the advice arrays.
Returns a plain dict of counts.
"""

from __future__ import annotations

import math

from naive import events_of, tie_ranks


def _s(x) -> float:
    """A score with NaN read as -inf."""
    x = float(x)
    return -math.inf if math.isnan(x) else x


def naive_proactive(stream, priority, capacity, *, budget=0, prio=None, pf=None, tie_break="id", seed=0,
                    warmup=0, lam=0.5, count_mask=None):
    """Replay event by event: refinement on ``pf[i]``, access, then the update by ``priority``."""
    L, N = int(stream.n_layers), int(stream.n_experts)
    tie = tie_ranks(L, N, tie_break, seed)
    cache = {l: set() for l in range(L)}
    last, freq, crf, plast = {}, {}, {}, {}
    clock = [0] * L
    out = dict(hits=[0] * L, misses=[0] * L, proactive=[0] * L, useful=[0] * L)
    pending = set()   # proactively loaded, not yet hit
    prev_ev = [-1] * L

    def rkey(b, i, l, pe):
        """Retention key of a resident before event i's access (advice: the layer's previous priority row)."""
        if priority == "advice":
            return _s(prio[pe][b - l * N]) if pe >= 0 else -math.inf
        if priority == "lru":
            return last.get(b, -1)
        if priority == "lfu":
            return freq.get(b, 0)
        if priority == "lfru":
            return freq.get(b, 0) / (i - last.get(b, -1) + 1)
        # lrfu: the CRF value decayed to the layer's clock
        return crf[b] * 2.0 ** (-lam * (clock[l] - plast[b])) if b in crf else -math.inf

    for i, (_, l, members) in enumerate(events_of(stream)):
        count = i >= warmup and (count_mask is None or bool(count_mask[i]))
        c = capacity[l]
        now = clock[l]
        clock[l] += 1
        C = cache[l]
        if budget > 0 and c > 0:
            cands = [(e, _s(pf[i][e])) for e in range(N) if _s(pf[i][e]) > -math.inf]
            cands.sort(key=lambda x: (-x[1], x[0]))
            for e, s in cands[:budget]:
                b = l * N + e
                if b in C:
                    continue
                if len(C) >= c:
                    # lowest score; among equal scores the lowest retention key, then the lowest tie rank
                    victim = min(C, key=lambda v: (_s(pf[i][v - l * N]), rkey(v, i, l, prev_ev[l]), tie[v]))
                    if not s > _s(pf[i][victim - l * N]):
                        continue
                    C.discard(victim)
                    pending.discard(victim)
                C.add(b)
                if count:
                    pending.add(b)
                last[b] = i
                if count:
                    out["proactive"][l] += 1
        E = [l * N + e for e in members]
        misses = [b for b in E if b not in C]
        for b in E:
            if b in C:
                if count:
                    out["hits"][l] += 1
                    if b in pending:
                        out["useful"][l] += 1
                pending.discard(b)
            elif count:
                out["misses"][l] += 1
            # LRFU: C(t) = 1 + 2^(-lam * (t - t_last)) * C(t_last)
            crf[b] = 1.0 + (2.0 ** (-lam * (now - plast[b])) * crf[b] if b in crf else 0.0)
            plast[b] = now
            last[b] = i
            freq[b] = freq.get(b, 0) + 1
        K = set(C) | set(misses)
        if len(K) > c:
            def key(b, i=i, l=l, E=E, now=now):
                if priority == "advice":
                    return (1 if b in E else 0, _s(prio[i][b - l * N]), tie[b])
                if priority == "lru":
                    return (last.get(b, -1), 0, tie[b])
                if priority == "lfu":
                    return (freq.get(b, 0), 0, tie[b])
                if priority == "lfru":
                    return (freq.get(b, 0) / (i - last.get(b, -1) + 1), 0, tie[b])
                if priority == "lrfu":   # the CRF value decayed to now
                    return (crf[b] * 2.0 ** (-lam * (now - plast[b])) if b in crf else -math.inf, 0, tie[b])
                raise ValueError(priority)

            keep = set(sorted(K, key=key, reverse=True)[:c])
            for b in K - keep:
                pending.discard(b)
            cache[l] = keep
        else:
            cache[l] = K
        prev_ev[l] = i
    tok_steps = {}
    for i in range(int(stream.n_events)):
        if i >= warmup and (count_mask is None or bool(count_mask[i])):
            tok_steps[int(stream.step[i])] = int(stream.active[i])
    return dict(hits=sum(out["hits"]), demand_misses=sum(out["misses"]), proactive_loads=sum(out["proactive"]),
                useful_prefetches=sum(out["useful"]), per_layer_hits=out["hits"],
                per_layer_misses=out["misses"], per_layer_proactive=out["proactive"],
                tokens=sum(tok_steps.values()))
