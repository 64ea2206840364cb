"""``benchmarks/_ab.machine``: the line that names the machine a benchmark's figures come from."""

from __future__ import annotations

from conftest import load_script


def _ab():
    return load_script("benchmarks/_ab.py", "bench_ab")


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx512f

processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
"""
ARM = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd

Hardware\t: BCM2835
"""


def test_cpu_model_reads_the_first_model_name_or_the_hardware_line():
    ab = _ab()
    assert ab.cpu_model(X86) == "Intel(R) Xeon(R) Processor"
    assert ab.cpu_model(ARM) == "BCM2835"
    assert ab.cpu_model("processor\t: 0\nmodel name\t:   \n") == ""      # an empty value is no name
    assert ab.cpu_model("") == ""


def test_machine_names_a_processor_the_cpus_and_what_llvm_compiles_for():
    line = _ab().machine()
    model, cpus, llvm = line.split("; ", 2)
    assert model and model != "unknown processor"
    n, word = cpus.split(" ")
    assert word == "CPUs" and int(n) >= 1
    assert llvm.startswith("LLVM host ") and "(" in llvm
