"""Cache-Learning Routers (CLR): Temporal and Spatio Routers, their losses, training and advice.

Submodules (torch is imported only by those that need it):

- :mod:`.config` — :class:`~.config.TrainConfig` and the training modes (no torch);
- :mod:`.adapters` — where each supported architecture keeps its native router;
- :mod:`.losses` — the soft top-B surrogate and the cache-coverage loss (torch);
- :mod:`.modules` — :class:`~.modules.CacheRouters`, hooks, ``L_T`` / ``L_ST`` (torch);
- :mod:`.train` — training on a model or offline from a trace, resumable (torch);
- :mod:`.checkpoint` — safetensors checkpoints; router weights readable with numpy alone;
- :mod:`.advice` — per-event priority / prefetch advice for an EventStream (numpy);
- :mod:`.evaluate` — replay sweeps (B, R), concentration, exact-match accuracy.
"""
