"""Key codes shared by the policy registry and the kernels (no numba import here).

Adding a dynamic policy: one code here, one branch of ``_kernels._key``, one
``register_policy`` line in ``policies.py``.
"""

KEY_LRU = 0
KEY_LEAST_STALE = 1
KEY_LFU = 2
KEY_LFRU = 3
KEY_BELADY = 4
KEY_BELADY_FORCED = 5
