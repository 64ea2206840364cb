"""Pin torch's CPU kernels to code paths that every x86-64 CPU runs the same way.

torch picks its vectorised kernels (ATen's ``AVX2``/``AVX512`` builds) and MKL picks its GEMM code
path at run time from the CPU it finds, and different paths sum in different orders: on this
project's machine a 3-step training run of the example model gives other weight bits with
``ATEN_CPU_CAPABILITY=default`` than with the detected ``AVX2`` path, and other bits again with
``MKL_CBWR=COMPATIBLE``. So "the same Python and packages" alone does not rebuild the weights on
another machine; the CPU's instruction set enters too (the documented build of 2026-11-30 was made
on a machine whose kernels we cannot name, and its weights do not rebuild here).

:data:`PORTABLE_ENV` removes that dependence: ATen's ``default`` (non-AVX) kernels, MKL's
conditional-numerical-reproducibility ``COMPATIBLE`` path (the same results on every x86-64
processor), and oneDNN switched off in-process. It must be in the environment before ``torch`` is
imported, so ``make_all.py`` sets it first and :func:`check` refuses to train or record otherwise.
"""

from __future__ import annotations

import os

#: Environment of every step that runs torch (training and recording).
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}


def apply() -> None:
    """Put :data:`PORTABLE_ENV` into ``os.environ`` (call before anything imports torch)."""
    os.environ.update(PORTABLE_ENV)


def check() -> None:
    """Raise unless this process's torch runs the portable kernels; switch oneDNN off."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    missing = {k: v for k, v in PORTABLE_ENV.items() if os.environ.get(k) != v}
    if capability != "DEFAULT" or missing:
        raise SystemExit(
            f"the example model needs torch's portable CPU kernels (found capability {capability}, "
            f"environment missing {missing}); run it through scripts/example_model/make_all.py, or set "
            + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items()) + " before starting Python")
    torch.backends.mkldnn.enabled = False
