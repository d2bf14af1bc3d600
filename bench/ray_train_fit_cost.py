"""What one Ray Train fit costs whatever it trains: `TorchTrainer` with N workers (default 2, 0.5 CPU each) whose
function reports once and returns, fitted in turn on a local Ray already up; each fit's wall time and the CPU the
whole machine spent during it (every process, Ray's included: /proc/stat, so run it on a quiet machine).

    python bench/ray_train_fit_cost.py [--workers 2] [--fits 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from machine import cpu_line, scratch  # noqa: E402  (bench/machine.py)


def machine_cpu_s() -> float:
    with open("/proc/stat") as f:  # user nice system idle iowait irq softirq: all but idle and iowait
        v = [int(x) for x in f.readline().split()[1:8]]
    return (v[0] + v[1] + v[2] + v[5] + v[6]) / os.sysconf("SC_CLK_TCK")


def report_once(config):
    import ray.train

    ray.train.report({"x": 1})


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--fits", type=int, default=3)
    args = p.parse_args()
    print(cpu_line(), flush=True)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.1")  # as the tests set it
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from pipeline.config import RayConfig
    from pipeline.ray_runtime import init_ray

    init_ray(RayConfig(num_cpus=2))  # a local Ray as the pipeline starts one: loopback, no dashboard, quiet
    time.sleep(5)  # Ray's own start-up settled
    storage = str(scratch("bench-fit-"))
    for i in range(args.fits):
        c0, t0 = machine_cpu_s(), time.perf_counter()
        TorchTrainer(report_once, scaling_config=ScalingConfig(num_workers=args.workers,
                                                               resources_per_worker={"CPU": 0.5}),
                     run_config=RunConfig(storage_path=storage, name=f"fit-{i}")).fit()
        wall = time.perf_counter() - t0
        time.sleep(2)  # the fit's processes exit
        print(f"fit {i + 1}: {wall:.1f} s wall, {machine_cpu_s() - c0:.1f} CPU-s of the machine", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
