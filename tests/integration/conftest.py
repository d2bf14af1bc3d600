"""How the integration tests are shared among the processes that run them side by side (`make test`:
pytest-xdist, `--dist loadgroup`, TEST_WORKERS_INTEGRATION processes, each with its own local Ray).

* A module whose tests share a module-scoped fixture (a Ray head, an encoded corpus) runs in one process,
  so that fixture is built once, not once per process.
* The longest tests are handed out first: the last test a process starts should be a short one, not a
  sweep of several minutes while the other processes have nothing left to do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

# modules whose tests take minutes (the Tune sweeps, the effects experiment, the simulated clusters, the
# chained trainings): started first (the order within a module is kept)
LONG_FIRST = ("test_tune", "test_effects_run", "test_arr", "test_rcl", "test_two_node", "test_ance_refresher",
              "test_reproduce_faq", "test_jobs", "test_train")


def _module_scoped(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope == "module" for defs in info.name2fixturedefs.values())


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    here = Path(__file__).parent
    ours = [item for item in items if here in item.path.parents]
    for item in ours:
        if _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))

    def rank(item) -> int:
        name = item.module.__name__.rpartition(".")[2]
        return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)

    if len(ours) == len(items):  # (an integration-only run: the order of a wider run is left alone)
        items.sort(key=rank)  # stable: the order within a module (and among the rest) is kept
