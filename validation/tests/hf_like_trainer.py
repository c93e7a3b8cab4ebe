"""A stand-in for a Hugging Face Trainer script as the hf_trainer adapter sees its output folder,
without torch or transformers: ``trainer_state.json`` (its ``log_history``, one entry a step, then
the summary ``train()`` logs), a ``checkpoint-N/`` where it stops early, and, with ``FAKE_HF_TB=1``,
rank 0's TensorBoard events of the steps it trains (needs the tensorboard package). The loss is a
function of the step, so a run resumed from a checkpoint logs what an uninterrupted one does.

    python hf_like_trainer.py --max_steps N --output_dir D [--stop_after K] [--resume_from FOLDER]

``--stop_after K`` trains steps 1..K and saves ``checkpoint-K``; ``--resume_from FOLDER`` (the
first half's output folder) keeps its newest checkpoint's ``log_history`` and trains from the step
after it, as ``Trainer.train(resume_from_checkpoint=...)`` does. ``FAKE_HF_FAULT=ignore_resume``: a
script that never passes the flag on to ``train()`` (the Trainer ignores
``TrainingArguments.resume_from_checkpoint``) trains from step 1 again, logging the same losses.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def _log(step: int) -> dict:
    return {"epoch": step / 100, "grad_norm": 1.5 + step / 100, "learning_rate": 1e-3 / step,
            "loss": 5.0 - step / 10, "step": step}


def _events(folder: Path, steps: list[int], start: float) -> None:
    """The events the Trainer's TensorBoard callback writes: opened as training begins, then
    train/loss, train/grad_norm, train/learning_rate per logged step."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.record_writer import RecordWriter

    run = folder / "runs" / "Dec06_12-00-00_host"
    run.mkdir(parents=True, exist_ok=True)
    with open(run / f"events.out.tfevents.{int(start)}.host.1.0", "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(Event(wall_time=start, file_version="brain.Event:2").SerializeToString())
        for i, step in enumerate(steps, 1):
            log = _log(step)
            for tag, key in (("train/loss", "loss"), ("train/grad_norm", "grad_norm"),
                             ("train/learning_rate", "learning_rate")):
                event = Event(wall_time=start + 0.25 * i, step=step,
                              summary=Summary(value=[Summary.Value(tag=tag, simple_value=log[key])]))
                writer.write(event.SerializeToString())


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--max_steps", type=int, required=True)
    p.add_argument("--output_dir", type=Path, required=True)
    p.add_argument("--stop_after", type=int)
    p.add_argument("--resume_from", type=Path)
    a = p.parse_args()
    out: Path = a.output_dir
    out.mkdir(parents=True, exist_ok=True)
    history: list[dict] = []
    if a.resume_from is not None and os.environ.get("FAKE_HF_FAULT") != "ignore_resume":
        newest = max(a.resume_from.glob("checkpoint-*"), key=lambda c: int(c.name.split("-")[1]))
        history = json.loads((newest / "trainer_state.json").read_text())["log_history"]
    start = max((h["step"] for h in history), default=0)
    last = a.stop_after or a.max_steps
    trained = list(range(start + 1, last + 1))
    history += [_log(s) for s in trained]
    if os.environ.get("FAKE_HF_TB") == "1":
        _events(out, trained, time.time())
    state = {"global_step": last, "max_steps": a.max_steps, "log_history": history}
    if a.stop_after:
        (out / f"checkpoint-{last}").mkdir()
        (out / f"checkpoint-{last}" / "trainer_state.json").write_text(json.dumps(state))
    summary = {"epoch": last / 100, "step": last, "train_runtime": 0.5, "train_loss": 4.5,
               "train_steps_per_second": 10.0, "total_flos": 1.0}
    (out / "trainer_state.json").write_text(json.dumps({**state, "log_history": history + [summary]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
