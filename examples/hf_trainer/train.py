"""Train a small Llama on bytes of Python source with the Hugging Face Trainer, as a user writes it.

Nothing here knows about the acceptance harness: every flag is the Trainer's own
(``TrainingArguments``, through ``HfArgumentParser``) or one of the data and model flags below.
The model is built from a ``LlamaConfig`` (nothing downloaded); its text is the Python standard
library's own source files, read in place, one byte a token.

    python examples/hf_trainer/train.py --output_dir /tmp/hf --max_steps 20 --report_to tensorboard
    torchrun --nproc_per_node 2 examples/hf_trainer/train.py --output_dir /tmp/hf --max_steps 20 --ddp_backend gloo
    python examples/hf_trainer/train.py --model nsa --output_dir /tmp/hf --max_steps 20 --bf16 true   # fla, CUDA

``--resume_from_checkpoint`` continues a run, as a Trainer script does: from a ``checkpoint-N``
folder, or from an output folder's latest checkpoint. ``--stop_after N`` stops after step N of a
run of ``--max_steps``, saving a checkpoint, as a job stopped mid-run leaves it (the learning-rate
schedule still spans ``--max_steps``):

    python examples/hf_trainer/train.py --output_dir /tmp/hf1 --max_steps 20 --stop_after 10
    python examples/hf_trainer/train.py --output_dir /tmp/hf2 --max_steps 20 --resume_from_checkpoint /tmp/hf1

The data is a stream: files are read once, in order, and a run that asks for more steps than
``--max_bytes`` of text holds ends when the stream runs dry: with accelerate's dispatcher (the
default for an iterable dataset) the Trainer raises "Batch does not contain any data"; with
``--accelerator_config`` naming a file of ``{"dispatch_batches": false}`` it stops at the first
epoch that yields no batch and exits 0.
"""
from __future__ import annotations

import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils.data import IterableDataset
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


@dataclass
class DataArguments:
    block_size: int = field(default=64, metadata={"help": "tokens (bytes) per sequence"})
    max_bytes: int = field(default=0, metadata={"help": "bytes of source to read at most (0: the whole library)"})


@dataclass
class RunArguments:
    stop_after: int = field(default=0, metadata={"help": "stop after this step with a checkpoint (0: at max_steps)"})


@dataclass
class ModelArguments:
    model: str = field(default="llama", metadata={"help": "llama (transformers) or nsa (fla's NSAForCausalLM, CUDA)"})
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    num_kv_heads: int = field(default=1, metadata={"help": "nsa: key/value heads"})
    head_dim: int = field(default=32, metadata={"help": "nsa: dimension of a head"})
    window_size: int = field(default=512, metadata={"help": "nsa: sliding window (0: none; fla runs it with flash-attn)"})


class SourceBytes(IterableDataset):
    """Blocks of ``block_size + 1`` bytes of the standard library's .py files, read once."""

    def __init__(self, block_size: int, max_bytes: int):
        self.block_size, self.max_bytes = block_size, max_bytes
        self._blocks = self._read()  # one pass: a second epoch gets what the first left

    def _read(self):
        root = Path(sysconfig.get_paths()["stdlib"])
        buf, read = b"", 0
        for path in sorted(root.glob("*.py")):
            data = path.read_bytes()
            if self.max_bytes:
                data = data[: self.max_bytes - read]
            read += len(data)
            buf += data
            while len(buf) > self.block_size:
                ids = torch.tensor(list(buf[: self.block_size]), dtype=torch.long)
                buf = buf[self.block_size:]
                yield {"input_ids": ids, "labels": ids.clone()}
            if self.max_bytes and read >= self.max_bytes:
                return

    def __iter__(self):
        return self._blocks


class StopAfter(TrainerCallback):
    """Ends training after step ``step`` of the run, saving a checkpoint to resume from."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_save = control.should_training_stop = True
        return control


def checkpoint_of(path: str | None) -> str | None:
    """The checkpoint ``--resume_from_checkpoint`` names: a checkpoint folder as it is, an output
    folder's latest ``checkpoint-N``."""
    if path is None or not Path(path).is_dir():
        return path
    return get_last_checkpoint(path) or path


def main() -> None:
    parser = HfArgumentParser((ModelArguments, DataArguments, RunArguments, TrainingArguments))
    model_args, data_args, run_args, training_args = parser.parse_args_into_dataclasses()
    torch.manual_seed(training_args.seed)
    if model_args.model == "nsa":
        from fla.models import NSAConfig, NSAForCausalLM

        model = NSAForCausalLM(NSAConfig(vocab_size=256, hidden_size=model_args.hidden_size,
                                         num_hidden_layers=model_args.num_hidden_layers,
                                         num_heads=model_args.num_attention_heads, num_kv_heads=model_args.num_kv_heads,
                                         head_dim=model_args.head_dim, intermediate_size=model_args.intermediate_size,
                                         window_size=model_args.window_size,
                                         max_position_embeddings=data_args.block_size))
    else:
        model = LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=model_args.hidden_size,
                                             num_hidden_layers=model_args.num_hidden_layers,
                                             num_attention_heads=model_args.num_attention_heads,
                                             intermediate_size=model_args.intermediate_size,
                                             max_position_embeddings=data_args.block_size))
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=SourceBytes(data_args.block_size, data_args.max_bytes),
                      callbacks=[StopAfter(run_args.stop_after)] if run_args.stop_after else None)
    # the Trainer leaves TrainingArguments.resume_from_checkpoint to the script: given to train(),
    # it loads the weights, optimizer, schedule and RNG states and skips the batches already trained
    result = trainer.train(resume_from_checkpoint=checkpoint_of(training_args.resume_from_checkpoint))
    trainer.log_metrics("train", result.metrics)
    trainer.save_state()


if __name__ == "__main__":
    main()
    # Under torchrun, destroy the process group once main() has returned: the Trainer and its
    # DDP model (whose reducer also holds the group) are gone by then, so the group dies here, in
    # a call that lets go of the GIL while gloo's worker threads finish. Destroyed inside main(),
    # the group would die later with the DDP model, the GIL held: a worker still freeing the last
    # all_gather's tensors waits for that GIL, and the process hangs; never destroyed, the same
    # worker is killed at the interpreter's exit (SIGABRT, "terminate called without an active
    # exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
