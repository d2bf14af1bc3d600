"""Shared fixtures: offline HF settings, a tiny random BERT, the bundled FAQ ingested once, one local
Ray per session. The builders they share with the tests are in fixtures.py."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Set before Ray / transformers are imported anywhere (docs/RAY.md §1 auth, §3 Train's poll interval).
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A dataset that cannot move (an actor pool that can never be placed) fails in 10 min, not Ray's 30
os.environ.setdefault("RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S", "600")
# What a test's Ray spends on nothing the tests look at (docs/performance.md, "Tests"): its metrics and event
# statistics, the memory monitor's polling, idle workers started ahead of any task, and per Train fit a preemption
# watcher actor (its own process) and Train's metrics callbacks. An idle local Ray: 6.9 % of a core with Ray's
# defaults, 4.2 % without these; a Ray Train fit ~12.7 CPU-s, ~11.9 without the watcher and metrics.
for _flag, _value in (("RAY_enable_metrics_collection", "0"), ("RAY_event_stats", "0"),
                      ("RAY_memory_monitor_refresh_ms", "0"), ("RAY_enable_worker_prestart", "0"),
                      ("RAY_prestart_worker_first_driver", "0"), ("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0"),
                      ("RAY_TRAIN_METRICS_ENABLED", "0")):
    os.environ.setdefault(_flag, _value)
# One compute thread per process for what does not set its own (torch's and MKL's pools read these when they
# start; the pipeline's own thread settings, encode.torch_threads and the workers' cpus, still set theirs): the
# tests' models are tiny, where a second thread costs more in synchronisation than it gains, and on a busy
# 2-core machine a pool of two spins against the other processes (the rerank tests: 30 s with two threads
# beside other work, 6.5 s with one). Inherited by the CLI subprocesses and the session's Ray.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", os.path.join(tempfile.gettempdir(), "pipeline-tests-hf"))
_MADE = "PIPELINE_TESTS_MADE"  # the folders a test process of this run made (not the user's)

if os.environ.get("PYTEST_XDIST_WORKER"):
    # A process of several running side by side (make test's two tiers): a temporary folder of its own, inside
    # the machine's, removed when it ends. Its Ray and everything that Ray starts inherit it (Ray's default
    # folder is $TMPDIR/ray), so a test that reads the temporary folder (the workers' scratch files, a local
    # Ray's sessions) sees what its own process made, not its neighbours'. Short: Ray's unix sockets live in it.
    _tmp = tempfile.mkdtemp(prefix=f"pt{os.environ['PYTEST_XDIST_WORKER'][2:]}-")
    os.environ["TMPDIR"] = _tmp
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    atexit.register(shutil.rmtree, _tmp, True)


def _own_temp_dir(var: str, prefix: str) -> None:
    """`var` names a folder of this test process's, removed when it ends, unless the user set it. A process of
    pytest-xdist (make test's unit tests) inherits the starting process's and makes its own: its tests make,
    break and prune export-cache entries, which another process's tests must not see."""
    made = [p for p in os.environ.get(_MADE, "").split(os.pathsep) if p]
    if os.environ.get(var) and os.environ[var] not in made:
        return  # the user's
    os.environ[var] = tempfile.mkdtemp(prefix=prefix)
    os.environ[_MADE] = os.pathsep.join([*made, os.environ[var]])
    atexit.register(shutil.rmtree, os.environ[var], True)


# encode.backend=openvino's converted towers: a folder of this session's, not the user's cache, removed
# when the session ends (a test run leaves nothing behind in the temporary folder)
_own_temp_dir("PIPELINE_EXPORT_CACHE", "pipeline-tests-exports-")
# local copies of what the tests put on object stores (each test's bucket is new): this session's, removed too
_own_temp_dir("PIPELINE_STAGING_DIR", "pipeline-tests-staging-")

from pipeline.runtime_env import setup_offline_env  # noqa: E402

setup_offline_env()

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def _one_torch_thread_after_each_test():
    """An in-process encode or training sets torch's thread count for its work (encode.torch_threads, the
    workers' cpus) and keeps it; the next test starts from one again (OMP_NUM_THREADS above says why)."""
    yield
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from pipeline.models.tiny import build_tiny_bert

    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """One local Ray for the whole session (2 CPUs, small object store, no dashboard)."""
    import ray

    temp = None
    if not ray.is_initialized():
        from pipeline.ray_runtime import force_loopback

        temp = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        force_loopback()  # else Ray re-resolves 127.0.0.1 to the routable IP and listens everywhere
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 object_store_memory=256 * 1024 * 1024, _node_ip_address="127.0.0.1",
                 _temp_dir=str(temp))
    yield ray
    ray.shutdown()
    if temp is not None:
        shutil.rmtree(temp, ignore_errors=True)  # Ray's logs and sockets of this session


@pytest.fixture(scope="session")
def faq(tmp_path_factory) -> Path:
    """The bundled Python FAQ ingested once (BEIR layout: queries.tsv, qrels/{all,train,test}.trec).
    Read-only for the tests: a test that changes a corpus copies it first."""
    from pipeline.data.bundled import python_faq_dir
    from pipeline.data.ingest import ingest

    out = tmp_path_factory.mktemp("faq") / "corpus"
    ingest([python_faq_dir()], "beir", out, progress=False)
    return out
