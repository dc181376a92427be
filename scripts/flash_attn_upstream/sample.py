"""pytest plugin for running flash-attn's test file against fattn (README.md beside it).

--sample-every N keeps one item in N of each test function, drawn uniformly from the product of its
parametrize markers (reproducibly: the draw is seeded by the function's name and --sample-seed), at
least one item per function. The sample is drawn before pytest expands the markers: the whole file has about 511,000
items, whose collection alone takes minutes and gigabytes per process.

DELIBERATE holds the test functions that test what fattn deliberately does not do (README.md's
list, with the reasons); they are deselected. Under pytest-xdist each worker takes one GPU of the
machine in turn (CUDA_VISIBLE_DEVICES, set before CUDA starts)."""

from __future__ import annotations

import math
import os
import random
import zlib

import pytest

# flash-attn's private interface, which fattn's public API does not reproduce.
DELIBERATE = {
    "test_flash_attn_generator_arg_must_be_none": "calls flash-attn's compiled extension (flash_attn_gpu) directly",
    "test_flash_attn_varlen_paged_kv_num_splits": "calls flash-attn's private _flash_attn_varlen_forward",
}
# Checks that need the device's values on the host: fattn makes them under FATTN_DEBUG_CHECKS=1 only.
DEBUG_CHECKS = {"test_flash_attn_kvcache_paged_block_table_bounds"}
_SAMPLED = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption("--sample-every", type=int, default=1, help="keep one item in N of each test function")
    parser.addoption("--sample-seed", type=int, default=0, help="moves each function's first sampled item")


def pytest_configure(config):
    config.stash[_SAMPLED] = {}
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    gpus = os.environ.get("FATTN_UPSTREAM_GPUS")
    if worker and gpus and "CUDA_VISIBLE_DEVICES" not in os.environ:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(int(worker.removeprefix("gw")) % int(gpus))


def _axes(markers):
    """Each parametrize marker as (argnames, values)."""
    axes = []
    for marker in markers:
        names, values = marker.args[0], list(marker.args[1])
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        if len(names) == 1:
            values = [(v,) for v in values]
        axes.append((names, values))
    return axes


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    """One parametrization holding the sampled combinations; the markers are dropped, so that
    pytest's own hook does not expand them."""
    config, definition = metafunc.config, metafunc.definition
    every = config.getoption("sample_every")
    markers = [m for m in definition.own_markers if m.name == "parametrize"]
    if not markers:
        return
    axes = _axes(markers)
    sizes = [len(values) for _, values in axes]
    total = math.prod(sizes)
    # A uniform draw, fixed by the function's name and the seed (a stride through the product would
    # hold the fastest axes constant whenever their sizes divide N).
    rng = random.Random(zlib.crc32(f"{definition.name}:{config.getoption('sample_seed')}".encode()))
    chosen = []
    for index in sorted(rng.sample(range(total), max(1, total // every))):
        parts = []
        for (_, values), size in zip(reversed(axes), reversed(sizes)):  # mixed radix, the last axis fastest
            index, digit = divmod(index, size)
            parts.append(values[digit])
        chosen.append(tuple(v for part in reversed(parts) for v in part))
    names = [n for axis_names, _ in axes for n in axis_names]
    definition.own_markers[:] = [m for m in definition.own_markers if m.name != "parametrize"]
    ids = ["-".join(str(v) for v in combo) for combo in chosen]
    metafunc.parametrize(names, chosen, ids=ids)
    config.stash[_SAMPLED][definition.name] = (len(chosen), total)


def pytest_collection_modifyitems(config, items):
    drop = [item for item in items if item.originalname in DELIBERATE]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item.originalname not in DELIBERATE]


def pytest_terminal_summary(terminalreporter, config):
    sampled = config.stash.get(_SAMPLED, {})
    if not sampled:
        return
    terminalreporter.write_sep("-", "sampled items per test function (kept / all)")
    for name, (kept, total) in sorted(sampled.items()):
        note = f"  deselected: {DELIBERATE[name]}" if name in DELIBERATE else ""
        terminalreporter.write_line(f"{kept:7d} / {total:7d}  {name}{note}")


@pytest.fixture(autouse=True)
def _debug_checks_where_needed(request, monkeypatch):
    if request.node.originalname in DEBUG_CHECKS:
        monkeypatch.setenv("FATTN_DEBUG_CHECKS", "1")
