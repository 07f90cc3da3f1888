"""bench/_common.py's host line: every benchmark prints it first, so a table says which CPU it ran on."""

from __future__ import annotations

import os
from pathlib import Path

from bench._common import host_line


def test_host_line_names_the_cpu_model_usable_cores_and_wide_vector_units():
    line = host_line()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name"))
    flags = set(next(ln.partition(":")[2] for ln in cpuinfo.splitlines() if ln.startswith("flags")).split())
    assert line.startswith(f"host: {model}, {len(os.sched_getaffinity(0))} usable cores of {os.cpu_count()}, ")
    assert ("AVX-512" in line) == ("avx512f" in flags) and ("AMX" in line) == ("amx_tile" in flags)
