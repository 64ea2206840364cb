"""Prefetch and activation-aware baselines as trace-driven advice (issue 9; CLR §1, §4.1, Table 1).

Each baseline is a producer of :class:`expertcache.nextuse.Advice` (retention
priorities and/or pre-access candidates) plus a retention key, replayed by
:func:`expertcache.replay.proactive.replay_proactive` under one charging rule:
every demand miss and every proactive insertion is one full expert transfer.
See docs/prefetch.md.
"""
