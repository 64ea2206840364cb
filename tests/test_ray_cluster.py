"""Ray as users run it: a cluster started outside the run, reached through ``RAY_ADDRESS`` alone.

A head node is started by a subprocess of the test (``ray.init`` with a private temporary directory,
so no other Ray session on the machine is touched) and stopped by ending that process in teardown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from expertcache.cli import main
from expertcache.experiment import run_spec, spec_from_dict
from expertcache.trace.synth import SynthConfig, synthesize_trace

ray = pytest.importorskip("ray")

_HEAD = """
import sys, time, ray
ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[1])
print(ray.get_runtime_context().gcs_address, flush=True)
while True:
    time.sleep(1)
"""


@pytest.fixture(scope="module")
def head():
    """The GCS address ``HOST:PORT`` of a one-CPU Ray head that lives as long as this module's tests."""
    # a short directory of its own: Ray's AF_UNIX socket paths (at most 107 bytes) live under it, and
    # pytest's temporary paths (longer still under pytest-xdist) overflow that
    tmp = Path(tempfile.mkdtemp(prefix="ecray", dir="/tmp" if os.path.isdir("/tmp") else None))
    # no token authentication, as `ray start --head` gives on a machine without ~/.ray/auth_token
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    err = open(tmp / "head.err", "w")       # noqa: SIM115 (closed in teardown)
    proc = subprocess.Popen([sys.executable, "-c", _HEAD, str(tmp)], stdout=subprocess.PIPE,
                            stderr=err, text=True, env=env)
    try:
        address = proc.stdout.readline().strip()
        if not address:
            last = (tmp / "head.err").read_text().strip().splitlines()[-1:] or ["(no output)"]
            pytest.skip(f"a local Ray head did not start: {last[0][:200]}")
        yield address
    finally:
        proc.terminate()           # ray.init's driver shuts its node down on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        err.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _spec(root: Path) -> dict:
    synthesize_trace(SynthConfig(n_layers=2, n_experts=8, top_k=2, n_requests=8, decode_tokens=5,
                                 working_set=4, seed=3)).save(root / "a")
    return {"experiment": {"name": "cluster"}, "inputs": {"a": {"trace": "a"}},
            "grid": {"input": "a", "batch": [1, 3], "policy": ["lru", "belady"], "rho": [0.25, 0.5]}}


def test_ray_address_alone_reaches_the_cluster_and_gives_the_local_table(head, tmp_path, monkeypatch):
    t0 = time.monotonic()
    spec = spec_from_dict(_spec(tmp_path), tmp_path)
    local = run_spec(spec, tmp_path / "local", jobs=1)
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.setenv("RAY_ADDRESS", head)
    report = run_spec(spec, tmp_path / "ray", executor="ray", jobs=7)     # no address: RAY_ADDRESS alone
    assert not ray.is_initialized()                 # the connection was closed, the cluster left running
    assert report.jobs == 1                         # the cluster's CPUs, not --jobs
    assert len(report.ran) == len(local.ran) == 8
    assert pq.read_table(tmp_path / "ray" / "results.parquet").equals(pq.read_table(tmp_path / "local" /
                                                                                    "results.parquet"))
    # the CLI, as a user types it after `ray start --head` and `export RAY_ADDRESS=...`
    _toml(tmp_path)
    res = CliRunner().invoke(main, ["spec", "run", str(tmp_path / "spec.toml"), "--store", str(tmp_path / "cli"),
                                    "--executor", "ray", "--json"])
    assert res.exit_code == 0, res.output
    assert '"jobs": 1' in res.output and '"complete": true' in res.output
    assert pq.read_table(tmp_path / "cli" / "results.parquet").equals(pq.read_table(tmp_path / "local" /
                                                                                    "results.parquet"))
    assert time.monotonic() - t0 < 600


def _toml(root: Path) -> None:
    (root / "spec.toml").write_text('[experiment]\nname = "cluster"\n[inputs.a]\ntrace = "a"\n[grid]\ninput = "a"\n'
                                    'batch = [1, 3]\npolicy = ["lru", "belady"]\nrho = [0.25, 0.5]\n')


def test_an_unreachable_cluster_is_one_line_and_leaves_no_store(tmp_path, monkeypatch):
    """Ray's connection failure (here provoked by a refused ``ray.init``) is one line; no store is left."""
    import expertcache.experiment.executors as ex

    def refuse(*args, **kwargs):
        raise ConnectionError("Could not find any running Ray instance.\nPlease ensure a cluster is running")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ex, "_import_ray", lambda: ray)
    _toml(tmp_path)
    _spec(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", "10.255.255.1:6379")
    res = CliRunner().invoke(main, ["spec", "run", str(tmp_path / "spec.toml"), "--store", str(tmp_path / "st"),
                                    "--executor", "ray"])
    assert res.exit_code == 2, res.output
    line = res.output.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "cannot reach the Ray cluster at '10.255.255.1:6379' (from RAY_ADDRESS)" in line
    assert "ray start --head" in line
    assert not (tmp_path / "st").exists()
    monkeypatch.delenv("RAY_ADDRESS")
    res = CliRunner().invoke(main, ["spec", "run", str(tmp_path / "spec.toml"), "--store", str(tmp_path / "st"),
                                    "--executor", "ray", "--address", "auto"])
    assert res.exit_code == 2 and "at 'auto' (from --address)" in res.output, res.output
    assert not (tmp_path / "st").exists()


def test_an_existing_store_is_kept_when_the_cluster_is_unreachable(tmp_path, monkeypatch):
    _toml(tmp_path)
    _spec(tmp_path)
    from expertcache.experiment.spec import load_spec

    run_spec(load_spec(tmp_path / "spec.toml"), tmp_path / "st", jobs=1)
    before = pq.read_table(tmp_path / "st" / "results.parquet")
    (tmp_path / "spec.toml").write_text((tmp_path / "spec.toml").read_text().replace("0.5]", "0.5, 0.75]"))
    monkeypatch.setattr(ray, "init", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("no")))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    res = CliRunner().invoke(main, ["spec", "run", str(tmp_path / "spec.toml"), "--store", str(tmp_path / "st"),
                                    "--executor", "ray", "--address", "auto"])
    assert res.exit_code == 2, res.output
    assert pq.read_table(tmp_path / "st" / "results.parquet").equals(before)
