"""The GPU's utilisation is read at most once every UTIL_EVERY_S, not at every logged step: NVML
reports it over its own sample period (1/6 s to 1 s), so a run of millisecond steps logging each one
read the same figure again and again, each reading a driver call inside the next step's time. Every
step record still carries the last reading."""
from __future__ import annotations

import json

import torch

from nsa.train import telemetry
from nsa.train.telemetry import CSV_HEADER, UTIL_EVERY_S, Telemetry


def _row(step: int) -> dict[str, float]:
    return {"step": step, **{k: 1.0 for k in CSV_HEADER[1:]}}


def test_the_gpus_utilisation_is_read_once_a_period_and_repeated_between(tmp_path, monkeypatch):
    readings, clock = [], [100.0]
    monkeypatch.setattr(telemetry, "gpu_util", lambda device: (readings.append(device) or (40.0 + len(readings), "")))
    monkeypatch.setattr(telemetry.time, "monotonic", lambda: clock[0])
    t = Telemetry(tmp_path, 0, True, torch.device("cpu"), heartbeat=True, nvtx=False)
    for step in range(1, 6):  # five logged steps within one period: one reading
        t.log_step(_row(step), {})
        clock[0] += UTIL_EVERY_S / 10
    clock[0] += UTIL_EVERY_S
    t.log_step(_row(6), {})
    t.close()
    assert len(readings) == 2
    steps = [b for b in map(json.loads, (tmp_path / "heartbeat_rank0.jsonl").read_text().splitlines())
             if b["stage"] == "step"]
    assert [b["gpu_util"] for b in steps] == [41.0] * 5 + [42.0]
    assert t.last["gpu_util"] == 42.0
