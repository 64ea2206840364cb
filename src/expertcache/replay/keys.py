"""Key codes shared by the policy registry and the kernels (no numba import here).

Adding a dynamic policy: one code here, one branch of ``_kernels._key``, one
``register_policy`` line in ``policies.py``. A key that changes only when its
block is accessed (``KEY_STABLE``) lets the engine keep residents in a heap;
any other key is re-evaluated for every candidate at each overflowing unit.
"""

KEY_LRU = 0
KEY_LEAST_STALE = 1
KEY_LFU = 2
KEY_LFRU = 3
KEY_BELADY = 4
KEY_BELADY_FORCED = 5
KEY_LRFU = 6

#: Codes whose key of a resident block changes only when the block is accessed.
#: (LRFU's combined recency-frequency value decays by the same factor for every block, so
#: ``log2 CRF + lambda * clock`` ranks like CRF and changes only on access.)
KEY_STABLE = (KEY_LRU, KEY_LEAST_STALE, KEY_LFU, KEY_BELADY, KEY_BELADY_FORCED, KEY_LRFU)
