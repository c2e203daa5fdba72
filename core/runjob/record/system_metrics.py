"""System metrics (CPU, memory, disk, network, GPU) from every machine, sampled by MLflow's own
monitors and recorded like the run's other metrics, as ``system/node<rank>/<name>``.

MLflow's ``SystemMetricsMonitor`` would send straight to the server and stop when it can't reach
it; here the samples go through the run's record, so they reach ``metrics.jsonl`` and survive a
lost server like every other metric.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any


class SystemMetricsSampler:
    """A daemon thread: every ``interval`` seconds, one sample of each monitor, logged through
    ``record(metrics, step)`` where the step is the number of seconds since the run began (so a
    resumed run continues the same axis)."""

    def __init__(
        self, record: Callable[[dict[str, float], int], None], interval: float, machine_rank: int, run_start_ms: int
    ) -> None:
        self.record = record
        self.interval = interval
        self.prefix = f"system/node{machine_rank}/"
        self.run_start_ms = run_start_ms
        self._stop = threading.Event()
        self._monitors = _monitors()
        self._thread = threading.Thread(target=self._run, name="runjob-system-metrics", daemon=True)

    def start(self) -> SystemMetricsSampler:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """Take one sample of every monitor and record it."""
        metrics: dict[str, float] = {}
        for monitor in self._monitors:
            try:
                monitor.collect_metrics()
                metrics.update(monitor.aggregate_metrics())
            except Exception:  # noqa: BLE001 - a monitor that fails (a GPU gone) just has no sample
                continue
            finally:
                monitor.clear_metrics()
        if metrics:
            step = max(0, int(time.time() - self.run_start_ms / 1000))
            self.record({self.prefix + name: float(value) for name, value in metrics.items()}, step)

    def stop(self) -> None:
        """Take a last sample and stop the thread."""
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout=30)
            self.sample()


def _monitors() -> list[Any]:
    # lazy: the training process imports this module and never imports mlflow (record.mirror)
    from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
    from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
    from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor

    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    try:
        # lazy: the training process imports this module and never imports mlflow (record.mirror)
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

        monitors.append(GPUMonitor())  # needs NVIDIA's management library (nvidia-ml-py) and a GPU
    except Exception:  # noqa: BLE001 - no NVIDIA GPU here: CPU, memory, disk and network only
        pass
    return monitors
