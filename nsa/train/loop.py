"""The Trainer: setup (distributed, model, wrap, optimizer, resume, data, telemetry, watchdog),
then one loop whose body has a fixed order: LR, micro-batch accumulation (data, forward,
backward; grads sync on the last micro-batch only), clip, stats exchange with the non-finite
guard, optimizer step, zero grads; then, per completed step, log, checkpoint, stop. With CUDA
graphs (train.cuda_graphs, nsa/train/graphs.py) the accumulation of every step after the
warm-up is one graph replay, and its gradients are overwritten in place by the next replay
instead of being zeroed.

The last step a run completes is always logged (training.csv and a step heartbeat), whatever
train.log_every, on every exit the trainer controls (done, .HALT, Ctrl-C, non-finite loss, an
exception): the harness compares the steps completed with the steps requested. A step stopped by
the non-finite guard did not complete (no optimizer step): it is no row of training.csv; its
losses are in the .HALT record and the rank's ``halt`` heartbeat."""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import contract
from ..attention import check_requested, set_graph_tokens
from ..config import ConfigError
from ..model import NSATransformer, backend_report, count_calls, gate_stats, track_gates
from ..model.flops import TRAINING_MULTIPLIER, forward_flops_per_token
from . import checkpoint as ckpt
from . import determinism, graphs
from .config import Resolved, RunConfig, config_dict
from .data import DocumentStream, Loader, build_source, run_tokens
from .distributed import all_gather_stats, barrier, init_distributed, launch_time, lost_peer, teardown, torchrun_env
from .faults import FaultInjector
from .interrupt import CtrlC, StopRequest
from .optim import build_optimizer, fused_adamw, lr_at, set_lr
from .parallelize import compute_dtype, parallelize, set_grad_sync
from .profile import ProfileStatus, cuda_kernel_names, profiled_window, summarize
from .profile import write as write_profile
from .telemetry import (Telemetry, device_memory_gb, environment, memory_gb, memory_source, ranks_gone, sdpa_flags,
                        write_json_atomic)
from .tensorboard import EventWriter
from .watchdog import Watchdog, halt_path, read_halt, write_halt

EXIT_NONFINITE = contract.EXIT_NONFINITE


@dataclass(frozen=True)
class StepResult:
    """One optimizer step's values, as host numbers (the step's stats exchange brought them over)."""

    step: int
    loss: float
    """Mean over ranks and micro-batches."""
    loss_rank: float
    lr: float
    grad_norm: float
    stop: StopRequest = StopRequest.NONE
    """The highest stop request of any rank (an operator .HALT, Ctrl-C, SIGTERM): the run stops
    after this step."""
    seconds: float = 0.0
    """Wall time since the previous step ended (set by the loop, which times the steps)."""

    @property
    def halt(self) -> bool:
        return self.stop is not StopRequest.NONE


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm became NaN/inf; carries the step's values, which are logged
    before the run halts."""

    def __init__(self, result: StepResult, losses: list[float]):
        self.result, self.losses = result, losses
        super().__init__(f"non-finite loss at step {result.step}: loss per rank {losses}, grad_norm "
                         f"{result.grad_norm}; halting before the optimizer step")


class Trainer:
    def __init__(self, cfg: RunConfig, resolved: Resolved):
        self.cfg, self.resolved = cfg, resolved
        source = self._checked_source()  # before anything starts
        self.determinism = determinism.apply(cfg.train.deterministic)  # before any CUDA work
        with contextlib.ExitStack() as stack:  # on a setup error, undo what was started
            self.info = info = init_distributed(cfg.dist, cfg.train)
            self.finished_cleanly = False  # set when train() returns 0; teardown then waits for peers
            self.failed = False  # set on an unexpected error (nsa.train.cli): teardown then leaves the group
            stack.callback(lambda: teardown(info, synchronize=self.finished_cleanly, abandon=self.failed))
            self.device = info.device
            self.graph_plan = graphs.plan(cfg.train.cuda_graphs, self.device.type, info.mode, cfg.fault.spec)
            self.step_graph = None
            if self.graph_plan.enabled:
                # from here on all work runs on the graph's stream (see nsa/train/graphs.py)
                stream = torch.cuda.Stream(self.device)
                stream.wait_stream(torch.cuda.current_stream(self.device))
                stack.enter_context(torch.cuda.stream(stream))
                self.step_graph = graphs.StepGraph(stream)
                stack.callback(self.step_graph.release)  # before the process group is destroyed
            self.out = Path(cfg.train.out_dir)
            try:
                self.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a file of that name, a file on the path, no permission
                raise ConfigError(f"train.out_dir={cfg.train.out_dir}: cannot make the output directory "
                                  f"({exc.strerror}: {exc.filename})") from None
            try:  # one that exists but takes no files (read-only, not ours) fails here, not mid-setup
                tempfile.TemporaryFile(dir=self.out).close()
            except OSError as exc:
                raise ConfigError(f"train.out_dir={cfg.train.out_dir}: cannot write into the output directory "
                                  f"({exc.strerror})") from None
            path = ckpt.find_resume(self.out, cfg.train.resume)  # one that is not there: before the model
            self.stop_reason = "starting"
            self.ctrl_c = CtrlC(info.rank)
            self._clear_stale_halt()
            self.watchdog = Watchdog(cfg.watchdog, self.out, info.rank, info.world_size)
            stack.callback(self.watchdog.close)
            self.watchdog.start()
            self.faults = FaultInjector(cfg.fault.spec, info.rank, self.device, self.log_all)
            self._apply_sdpa_flags()

            # a backend named in the config that cannot run here: refused before the model is built
            check_requested(cfg.model.attn, self.device, compute_dtype(cfg))

            # model: identical init on every rank (DDP also broadcasts; FSDP2 shards this copy)
            self.watchdog.beat(0, "setup")
            torch.manual_seed(cfg.train.seed)
            self.model = NSATransformer(cfg.model).to(self.device)
            track_gates(self.model, not cfg.telemetry.disable_aux_stats)  # the logged steps' gate means
            count_calls(self.model)  # the backend audit's layer-calls (env.json, the logged steps' routes)
            # the trainer graphs whole steps itself (train.cuda_graphs), and its eager steps (FSDP2,
            # fault injection, DDP's warm-up) stay eager: no layer keeps graphs of its own
            set_graph_tokens(self.model, 0)
            self.log(f"[model] {self.model.num_params():,} parameters; dist mode {info.mode}, "
                     f"world {info.world_size}, device {self.device}, backend {info.backend}")
            self.wrapped = parallelize(self.model, cfg, info, self.log)
            self.fused_adamw = fused_adamw(cfg.train.fused_adamw, self.device)
            self.optimizer = build_optimizer(self.wrapped, cfg.train, self.fused_adamw)
            self.watchdog.beat(0, "setup")

            self.step, data_position, self.resumed_from = 0, 0, None
            if path is not None:
                state = ckpt.load(path, self.wrapped, self.optimizer, info, config_dict(cfg))
                self.step, data_position, self.resumed_from = state["step"], state["data_position"], str(path)
                if self.step > cfg.train.steps:
                    raise ckpt.CheckpointError(f"{path}: the checkpoint is at step {self.step}, past train.steps="
                                               f"{cfg.train.steps}: nothing to train; resume with train.steps "
                                               f"above {self.step}")
                self.log(f"[ckpt] resumed from {path} at step {self.step} (data position {data_position})")
                data_position = self._break_resume(data_position)
                for diff in ckpt.config_differences(state["config"].get("model", {}), config_dict(cfg)["model"]):
                    self.log(f"[ckpt] warning: the model config differs from the checkpoint's: {diff}")
                for diff in ckpt.schedule_differences(state["config"].get("train", {}), config_dict(cfg)["train"]):
                    self.log(f"[ckpt] warning: the LR schedule differs from the checkpoint's run: {diff}; the "
                             "learning rate of every step from here is that of the new schedule")
                for diff in ckpt.data_differences(state["config"].get("data", {}), config_dict(cfg)["data"]):
                    self.log(f"[ckpt] warning: the data differs from the checkpoint's run: {diff}; this run reads "
                             f"its data from micro-batch {data_position} of the new data")
            elif (self.out / contract.TRAINING_CSV).exists() or ckpt.ckpt_dir(self.out).exists():
                # starting afresh over an earlier run: its training.csv is replaced and its checkpoints
                # are moved aside, neither overwritten by this run's of the same step nor taken by a
                # later train.resume=auto (its `latest` pointer) as this run's
                kept = ckpt.set_aside(self.out) if info.is_master else None
                self.log(f"[out] warning: {self.out} holds an earlier run; starting afresh at step 1 "
                         "(train.resume=auto would continue it); its training.csv, heartbeats and stack "
                         "dumps are replaced" + (f" and its checkpoints moved to {kept}" if kept else ""))
            self._clear_earlier_rank_files(fresh=path is None)
            self.step_first = self.step + 1  # the first step this process runs
            self.graph_note = ""  # how graph capture went, for env.json
            self.profile_status: ProfileStatus | None = None  # train.profile_steps, planned by train()

            self.telemetry = Telemetry(self.out, info.rank, info.is_master, self.device,
                                       cfg.telemetry.heartbeat, cfg.telemetry.nvtx, resume_step=self.step)
            stack.callback(self.telemetry.close)
            self.events = EventWriter(cfg.telemetry, self.out, info.is_master, resume_step=self.step)
            stack.callback(self.events.close)
            self.data_start = data_position  # where this run's data starts (env.json's data_position)
            self.loader = Loader(source, cfg.data, cfg.train.batch_size, info.rank, info.world_size,
                                 self.device, start_micro=data_position)
            stack.callback(self.loader.close)
            self.log(f"[data] {source.describe()}")
            self.tokens_per_step = (cfg.train.batch_size * cfg.train.seq_len * cfg.train.grad_accum
                                    * info.world_size)
            self.forward_flops = forward_flops_per_token(cfg.model, cfg.train.seq_len)
            self.flops_per_token = TRAINING_MULTIPLIER * sum(self.forward_flops.values())
            self.system = environment()
            self.write_env()
            self._closers = stack.pop_all()

    # --- helpers --------------------------------------------------------------------------

    def _checked_source(self):
        """The data source, its files opened and the records the run reads read as its loader will
        (DocumentStream.check): a bad path, file or record fails now, naming the key or the data
        file and line, not when the loader reaches it, hours into the run. Every rank reads every
        row of a stream, so every rank checks what it will read."""
        cfg = self.cfg
        rank, _, world = torchrun_env() or (0, 0, 1)

        def say(msg: str) -> None:
            if rank == 0:
                print(msg, flush=True)

        source = build_source(cfg.data, cfg.train.seq_len, cfg.model.vocab_size, cfg.train.seed)
        if isinstance(source, DocumentStream):
            source.check(run_tokens(cfg.train, world), say)
        return source

    def log(self, msg: str) -> None:
        if self.info.is_master:
            print(msg, flush=True)

    def log_all(self, msg: str) -> None:
        print(f"[rank {self.info.rank}] {msg}", file=sys.stderr, flush=True)

    def _clear_stale_halt(self) -> None:
        """A .HALT left by an earlier run would stop this one at once: it is recorded and removed.
        An operator's written since this run was launched (a stop asked for while it starts) is
        this run's: kept, it stops the run after its first step. A watchdog's or the non-finite
        guard's is an earlier run's whenever written (this run's own come later)."""
        halt = read_halt(self.out)
        if halt is not None and halt.get("source") not in (contract.HALT_WATCHDOG, contract.HALT_NONFINITE):
            try:
                if halt_path(self.out).stat().st_mtime >= launch_time():
                    halt = None
            except FileNotFoundError:
                halt = None
        self.previous_halt = halt
        barrier(self.info)
        if self.info.is_master and self.previous_halt is not None:
            halt_path(self.out).unlink(missing_ok=True)
            self.log(f"[halt] removed a stale .HALT from an earlier run: {self.previous_halt}")
        barrier(self.info)

    def _clear_earlier_rank_files(self, fresh: bool) -> None:
        """Remove what an earlier run in this out_dir left that would be read as this run's: the
        heartbeats and stack dumps of ranks this run does not have (a file of a rank at or above
        world_size breaks the artifact contract: a run of 2 ranks followed by one of 1 failed
        nsa-validate check-artifacts) and, starting afresh, this rank's stack dump (an earlier
        stall's dump beside a run that completed)."""
        if fresh:
            self.watchdog.clear_dump()
        if not self.info.is_master:
            return
        for path in sorted(self.out.iterdir()):
            numbered = contract.HEARTBEAT_PATTERN.match(path.name) or contract.STACKDUMP_PATTERN.match(path.name)
            if numbered and int(numbered.group(1)) >= self.info.world_size:
                path.unlink(missing_ok=True)
                self.log(f"[out] removed {path.name}, left by an earlier run: this run has "
                         f"{self.info.world_size} rank(s)")

    def _break_resume(self, data_position: int) -> int:
        """The injected resume faults (NSA_FAULT resume_skip, resume_reseed): the data position
        the run goes on from, and the RNG reseeded instead of restored, as a buggy trainer would."""
        if self.faults.resume_reseed:
            torch.manual_seed(self.cfg.train.seed)
            self.log_all("[fault] resume_reseed: RNG reseeded with train.seed, not restored from the checkpoint")
        skip = self.faults.resume_skip()
        if skip:
            self.log_all(f"[fault] resume_skip: data starts at micro-batch {data_position + skip}, "
                         f"not the checkpoint's {data_position}")
        return data_position + skip

    def _apply_sdpa_flags(self) -> None:
        s = self.cfg.sdpa
        if s.flash_only:
            torch.backends.cuda.enable_mem_efficient_sdp(False)
            torch.backends.cuda.enable_math_sdp(False)
            torch.backends.cuda.enable_cudnn_sdp(False)
        if s.no_flash:
            torch.backends.cuda.enable_flash_sdp(False)

    def autocast(self):
        if self.cfg.train.dtype == "bfloat16" and self.info.mode != "fsdp":
            return torch.autocast(self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()  # float32, or FSDP2's mixed-precision policy casts

    @contextlib.contextmanager
    def stage(self, step: int, name: str):
        self.watchdog.beat(step, name)
        with self.telemetry.stage(step, name):
            self.faults.at(step, name)
            yield

    def where(self) -> str:
        """Where the run is, for the message of what stopped it: 'at step 7' while step 7 runs,
        'at the checkpoint of step 6' while a completed step's checkpoint (or profile) is written,
        'after step 6' between steps. Taken from the last stage entered, not from the last step
        completed plus one, which named a failed save of step 6 'error at step 7'."""
        step, stage = self.watchdog.step, self.watchdog.stage
        if step > self.step:
            return f"at step {step}"
        if stage in ("checkpoint", "profile") and step > 0:
            return f"at the {stage} of step {step}"
        return f"after step {self.step}"

    def operator_halt(self) -> bool:
        rec = read_halt(self.out)
        return rec is not None and rec.get("source") != contract.HALT_WATCHDOG

    def stop_request(self) -> StopRequest:
        """This rank's reason to stop after the step in flight, the highest if several."""
        if self.watchdog.terminate_requested:
            return StopRequest.SIGTERM
        if self.ctrl_c.requested:
            return StopRequest.CTRL_C
        return StopRequest.HALT if self.operator_halt() else StopRequest.NONE

    # --- env.json -------------------------------------------------------------------------

    def write_env(self) -> None:
        if not self.info.is_master:
            return
        cfg, r = self.cfg, self.resolved
        backends = backend_report(self.model, self.cfg.train.seq_len)
        # every backend of the dense stage (model.attn.kind=dense) is an SDPA kernel
        sdpa_routed = sorted(s for s, b in backends.items()
                             if s == "dense" or "sdpa" in b["backend"] or "flash" in b["backend"])
        nvtx = "off"
        if cfg.telemetry.nvtx:
            nvtx = "on" if self.device.type == "cuda" else "requested, but CUDA is unavailable: no ranges emitted"
        write_json_atomic(self.out / contract.ENV_JSON, self.faults.drop_optional({
            "contract_version": contract.VERSION,
            "status": self.stop_reason,
            "config_path": r.config_path,
            "config": config_dict(cfg),
            "overrides": r.overrides,
            "env_toggles": r.env_applied,
            "noop_toggles": r.noop_toggles,
            "env": r.env_seen,
            "world_size": self.info.world_size,
            "rank0_device": str(self.device),
            "dist": {"mode": self.info.mode, "backend": self.info.backend},
            **self.system,
            "attention_backends": backends,
            "sdpa": {"flags": sdpa_flags(), "audit": cfg.sdpa.audit, "branches_on_sdpa": sdpa_routed,
                     "note": "" if sdpa_routed else "no NSA stage is routed to SDPA/flash: the sdpa.* "
                     "kernel toggles do not change attention in this run"},
            "nvtx": nvtx,
            "tensorboard": {"setting": cfg.telemetry.tensorboard, "writing": self.events.writing,
                            "note": self.events.note},
            "memory_source": memory_source(self.device),
            "device_mem_gb": device_memory_gb(self.device),
            "gpu_util_note": self.telemetry.util_reason,
            "optimizer": {"name": "AdamW", "fused_setting": cfg.train.fused_adamw, "fused": self.fused_adamw},
            "cuda_graphs": {"setting": self.graph_plan.setting, "enabled": self.graph_plan.enabled,
                            "reason": self.graph_plan.reason, "warmup_steps": self.graph_plan.warmup_steps,
                            "captured": self.graphed, "note": self.graph_note},
            "fault_injection": cfg.fault.spec or None,
            "determinism": self.determinism,
            "tokens_per_step": self.tokens_per_step,
            # the harness's mfu divides tokens/s x this by the hardware's peak (nsa/model/flops.py)
            "model_flops_per_token": self.flops_per_token,
            "model_flops": {"seq_len": cfg.train.seq_len, "training_multiplier": TRAINING_MULTIPLIER,
                            "forward_per_token": self.forward_flops},
            "data": dataclasses.asdict(self.loader.source.summary()),
            contract.ENV_PROFILE: dataclasses.asdict(self.profile_status) if self.profile_status else None,
            "resumed_from": self.resumed_from,
            # global micro-batches consumed before this run's first step and after its last: a
            # resumed run starts where the run it continues ended
            "data_position": {"start": self.data_start, "end": self.loader.position},
            "previous_halt": self.previous_halt,
        }))

    # --- one optimizer step ---------------------------------------------------------------

    @property
    def graphed(self) -> bool:
        """True once the step is a captured CUDA graph."""
        return self.step_graph is not None and self.step_graph.owns_grads

    @property
    def steady_step(self) -> int:
        """The first step of this process that runs as it will for the rest of the run (the
        capture step's successor under graphs); profiling and benchmarks start here."""
        if self.step_graph is None:
            return self.step_first + 1
        return self.step_first + self.graph_plan.warmup_steps + 1

    def micro_batches(self, step: int):
        """This step's micro-batches from the loader, each load a 'data' stage."""
        for _ in range(self.cfg.train.grad_accum):
            with self.stage(step, "data"):
                batch = self.loader.next()
            yield batch

    def forward_backward(self, step: int, batches) -> torch.Tensor:
        """Forward and backward of each micro-batch; gradients sync on the last one only. DDP's
        static_graph must see one fully synced iteration first (its reducer asserts otherwise),
        so the first step of a static-graph run syncs every micro-batch: same gradients.
        Returns the mean loss over the micro-batches (a device tensor: no host sync)."""
        tc = self.cfg.train
        first_static = step == self.step_first and self.cfg.dist.ddp_static_graph
        loss_sum = torch.zeros((), device=self.device)
        for micro, (x, y) in enumerate(batches):
            set_grad_sync(self.wrapped, self.info, micro == tc.grad_accum - 1 or first_static)
            with self.stage(step, "forward"), self.autocast():
                logits = self.wrapped(x)
                loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
                loss = self.faults.corrupt_loss(loss, step)
            with self.stage(step, "backward"):
                (loss / tc.grad_accum).backward()
            loss_sum += loss.detach()
        return loss_sum / tc.grad_accum

    def graphed_forward_backward(self, step: int) -> torch.Tensor:
        """forward_backward as a CUDA graph: eager for the warm-up steps, captured at the next,
        replayed after. A failed capture ends the run with an error naming the way out: the
        process is not fit to go on eagerly (a capture that fails part-way leaves torch's CUDA
        RNG in capture mode, and under DDP the ranks' collectives out of step)."""
        if step < self.step_first + self.graph_plan.warmup_steps:
            return self.forward_backward(step, self.micro_batches(step))
        with self.stage(step, "data"):
            batches = [self.loader.next() for _ in range(self.cfg.train.grad_accum)]
        with self.stage(step, "graph"):  # one replay: every micro-batch's forward and backward
            if self.graphed:
                return self.step_graph.run(batches, None)
            try:
                loss = self.step_graph.run(batches, lambda static: self.forward_backward(step, static))
            except Exception as exc:
                self.graph_note = f"capture failed at step {step}: {exc!r}"
                raise RuntimeError(f"CUDA graph capture failed at step {step}: {exc!r}. Train without graphs "
                                   "with train.cuda_graphs=off (env NSA_CUDA_GRAPHS=0)") from exc
            self.graph_note = f"captured at step {step}"
            self.log(f"[graphs] step captured as a CUDA graph at step {step}; replayed from now on")
            self.write_env()
            return loss

    def train_step(self, step: int) -> StepResult:
        """Runs optimizer step ``step`` (1-based) and returns its values; raises NonFiniteLoss
        (before the optimizer step) when the loss or the gradient norm is not finite."""
        tc = self.cfg.train
        lr = lr_at(step - 1, tc)
        set_lr(self.optimizer, lr)
        if self.step_graph is not None:
            loss_mean = self.graphed_forward_backward(step)
        else:
            loss_mean = self.forward_backward(step, self.micro_batches(step))
        with self.stage(step, "optimizer"):
            # clip (the norm is computed even when clipping is off, for the log)
            max_norm = tc.grad_clip if tc.grad_clip > 0 else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(self.wrapped.parameters(), max_norm)
            if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
                norm = norm.full_tensor()
            stop = float(self.stop_request())
            stats = torch.stack([loss_mean, norm.float(), torch.tensor(stop, device=self.device)])
            gathered = all_gather_stats(self.info, stats)  # the step's one host sync point
            losses = [g[0] for g in gathered]
            result = StepResult(step, loss=sum(losses) / len(losses), loss_rank=losses[self.info.rank], lr=lr,
                                grad_norm=gathered[0][1], stop=StopRequest(int(max(g[2] for g in gathered))))
            if not all(map(_finite, losses + [result.grad_norm])):
                raise NonFiniteLoss(result, losses)
            self.optimizer.step()
            if not self.graphed:  # a captured backward writes the gradients in place
                self.optimizer.zero_grad(set_to_none=True)
        return result

    def halt_nonfinite(self, exc: NonFiniteLoss) -> None:
        """The non-finite guard's stop: .HALT (rank 0) and a halt heartbeat (every rank), each
        with the step's losses; the step itself did not complete and is no row."""
        r = exc.result
        if self.info.is_master:
            write_halt(self.out, {"source": contract.HALT_NONFINITE, "step": r.step, "losses": exc.losses,
                                  "grad_norm": r.grad_norm, "time": time.time(), "text": str(exc)})
        self.telemetry.heartbeat({"step": r.step, "stage": "halt", "reason": str(exc), "losses": exc.losses,
                                  "grad_norm": r.grad_norm})
        # every rank saw the gathered loss and stops here; none leaves before rank 0's .HALT is
        # written, or torchrun, seeing a rank exit, SIGTERMs rank 0 first and the NaN goes unsaid
        barrier(self.info)

    # --- the loop -------------------------------------------------------------------------

    def train(self) -> int:
        tc = self.cfg.train
        self.step_first = self.step + 1
        self.watchdog.steady_from(self.steady_step)
        self.stop_reason = "running"
        last = tc.steps if not tc.run_steps else min(tc.steps, self.step + tc.run_steps)
        quit_after = self.faults.quit_after()  # NSA_FAULT quit_early: stop short, as a buggy trainer would
        if quit_after is not None and quit_after < last:
            last = max(quit_after, self.step)
        self.last_saved = self.last_logged = self.step
        self.completed: list[StepResult] = []  # run, waiting to be logged and checkpointed
        self.last_result: StepResult | None = None  # the last step this process completed
        self.profile_status = self.plan_profile(last)
        self._t_prev = time.perf_counter()
        self.stopped_by = StopRequest.NONE  # what the ranks agreed to stop for
        halted = False
        with self.ctrl_c:
            try:
                while self.step < last and not halted:
                    self.run_steps(last)
                    while self.completed and not halted:
                        halted = self.finish_step(self.completed.pop(0), last)
                if not halted and self.step == last and last == quit_after:
                    self.stop_reason = (f"quit after step {self.step} of {tc.steps} (injected fault quit_early: "
                                        "exit 0 without .HALT)")
                elif not halted:
                    self.stop_reason = (f"completed {tc.steps} steps" if self.step == tc.steps else
                                        f"stopped after train.run_steps={tc.run_steps} at step {self.step} "
                                        f"of {tc.steps}")
                # a run stopped early (run_steps, operator .HALT, Ctrl-C, SIGTERM) always saves, or it could not resume
                if self.step != self.last_saved and (tc.save_final or self.step < tc.steps):
                    self.save(self.step)
                self.log(f"[done] {self.stop_reason}")
                self.write_env()
                self.finished_cleanly = True
                return self.stopped_by.exit_status
            except NonFiniteLoss as exc:
                self.log_before_exit()
                self.halt_nonfinite(exc)
                self.stop_reason = str(exc)
                self.log_all(f"[halt] {exc}")
                self.write_env()
                return EXIT_NONFINITE
            except BaseException as exc:
                # first, before anything this rank writes: the peers that failed on the same broken
                # collective end within moments, and a later look would find them gone too
                peer = lost_peer(self.info, exc, lambda: ranks_gone(self.out, self.info.peers))
                self.log_before_exit()
                if isinstance(exc, torch.OutOfMemoryError):
                    self.stop_reason = f"out of memory {self.where()}: {exc}"
                    self.oom_report(exc)
                elif isinstance(exc, KeyboardInterrupt):
                    self.stop_reason = f"interrupted (Ctrl-C twice) {self.where()}"
                elif peer is not None:
                    # the backend's text (an address, a source line) kept as the detail of plain words
                    lost = (f"lost {peer} {self.where()}: a connection of rank {self.info.rank}'s collective broke "
                            "(a peer's process ended, or its host went away)")
                    self.log_all(lost)
                    self.stop_reason = f"{lost}; detail: {_described(exc)}"
                else:
                    self.stop_reason = f"error {self.where()}: {_described(exc)}"
                try:
                    self.write_env()
                except OSError as env_exc:  # the disk that failed the run: its error is the one to see
                    self.log_all(f"[env] could not record the error in env.json: {env_exc}")
                raise

    def run_steps(self, last: int) -> None:
        """Runs the next step, or the profiled window's steps when it starts here; each
        completed step joins ``self.completed``."""
        step, p = self.step + 1, self.profile_status
        if p is not None and step == p.first_step:
            self.run_profiled(step, min(p.requested_steps, last - step + 1))
        else:
            self.completed.append(self.run_step(step))

    def plan_profile(self, last: int) -> ProfileStatus | None:
        """train.profile_steps: the window starts at the first steady step (nsa/train/profile.py)."""
        n = self.cfg.train.profile_steps
        if not n:
            return None
        status = ProfileStatus(requested_steps=n, first_step=self.steady_step)
        if status.first_step > last:
            status.note = (f"not profiled: the run ends at step {last}, before its first steady step "
                           f"{status.first_step}")
        return status

    def run_profiled(self, first: int, n: int) -> None:
        """The profiled window: ``n`` steps back to back, nothing else in it (they are logged
        after it closes, by the loop); then rank 0 writes profile.json and the rest."""
        p = self.profile_status
        p.note = f"stopped inside the profiled window (steps {first}..{first + n - 1}): no profile written"
        with profiled_window(self.device, profiling=self.info.is_master) as window:
            for step in range(first, first + n):
                with window.step():
                    result = self.run_step(step)
                self.completed.append(result)
                p.profiled_steps += 1
                if result.halt:
                    break
            end = first + p.profiled_steps - 1
            if self.info.is_master:
                # the last step ends here: stopping the profiler is the profile's work, which the
                # step times leave out, and the heartbeats say so before it starts
                self.watchdog.beat(end, "profile")
                self.telemetry.stage_beat(end, "profile")
        p.note = (f"steps {first}..{end}" + ("" if p.profiled_steps == p.requested_steps else
                  f": {p.profiled_steps} of the {p.requested_steps} asked, as the run "
                  + ("was stopped (.HALT, Ctrl-C or SIGTERM)" if result.halt else f"ends at step {end}")))
        if self.info.is_master:
            with self.stage(end, "profile"):  # a beat: summarising a long window takes a while
                profile, timeline, table = summarize(window, p.profiled_steps, first, self.graphed,
                                                     cuda_kernel_names(self.device))
                p.files = write_profile(self.out, profile, timeline, table)
            busy = "" if profile.gpu_busy_frac is None else f", GPU busy {profile.gpu_busy_frac:.3f}"
            self.log(f"[profile] {p.note}{busy}: {', '.join(p.files)}")
            self.write_env()
        self._t_prev = time.perf_counter()  # the profile's bookkeeping is no step's time

    def run_step(self, step: int) -> StepResult:
        """train_step, timed from the end of the previous step."""
        result = self.train_step(step)
        now = time.perf_counter()
        result = dataclasses.replace(result, seconds=now - self._t_prev)
        self._t_prev = now
        self.step, self.last_result = step, result
        return result

    def finish_step(self, r: StepResult, last: int) -> bool:
        """Log, print and checkpoint a completed step; True when the run stops after it."""
        tc = self.cfg.train
        if r.step % tc.log_every == 0 or r.step == last or r.halt:
            self.log_step(r)
        if r.step == self.step_first:
            self.after_first_step()
        if r.step % tc.print_every == 0 or r.step == self.step_first:
            self.log(f"step {r.step}/{tc.steps} | loss {r.loss:.4f} | lr {r.lr:.3g} | "
                     f"toks/s {self.tokens_per_step / r.seconds:,.0f} | step {r.seconds:.3f}s | "
                     f"grad_norm {r.grad_norm:.3f}")
        if tc.ckpt_every and r.step % tc.ckpt_every == 0:
            self.save(r.step)
            self.last_saved = r.step
        if r.halt:
            self.stopped_by = r.stop
            self.stop_reason = r.stop.reason(r.step)
        return r.halt

    def log_before_exit(self) -> None:
        """On an abnormal stop, log what the loop has not: completed steps still waiting (by
        train.log_every) and the last completed step whatever the interval. Without the
        auxiliary statistics, which read the device, and never raising over the error that
        stopped the run."""
        try:
            waiting, self.completed = self.completed, []
            for r in waiting:
                if r.step % self.cfg.train.log_every == 0:
                    self.log_step(r, aux=False)
            if self.last_result is not None and self.last_logged < self.last_result.step:
                self.log_step(self.last_result, aux=False)
        except Exception as exc:  # the original error matters more than this log line
            self.log_all(f"[log] could not log the last completed step before stopping: {exc!r}")

    def log_step(self, r: StepResult, aux: bool = True) -> None:
        mem = memory_gb(self.device)
        row = {"step": r.step, "loss": r.loss, "lr": r.lr, "toks_per_s": self.tokens_per_step / r.seconds,
               "step_time_s": r.seconds, "grad_norm": r.grad_norm,
               "mem_alloc_gb": mem["mem_alloc_gb"], "mem_reserved_gb": mem["mem_reserved_gb"]}
        extra = {"loss_rank": r.loss_rank, "mem_peak_gb": mem["mem_peak_gb"],
                 "toks_per_s_rank": self.tokens_per_step / self.info.world_size / r.seconds}
        if aux and not self.cfg.telemetry.disable_aux_stats:
            routes = backend_report(self.model, self.cfg.train.seq_len)
            extra["gates"] = gate_stats(self.model)  # a device sync: logged steps only
            extra["routes"] = {s: {"backend": b["backend"], "calls": b["calls"]} for s, b in routes.items()}
            # a fallback: 'auto' had to skip a faster backend meant for this device
            extra["fallbacks"] = {s: (b["calls"] if b["fallback"] else 0) for s, b in routes.items()}
        self.telemetry.log_step(row, extra, garbled=self.faults.garbled_row(r.step))
        self.events.log_step(row, extra, self.flops_per_token)
        self.last_logged = max(self.last_logged, r.step)

    def after_first_step(self) -> None:
        self.write_env()  # now with the attention backends each branch actually used
        if self.cfg.sdpa.audit:
            for stage, b in backend_report(self.model, self.cfg.train.seq_len).items():
                self.log(f"[sdpa-audit] {stage}: {b['backend']} ({b['reason']}), {b['calls']} layer-calls")
            self.log(f"[sdpa-audit] torch SDPA kernels enabled: {sdpa_flags()}")

    def save(self, step: int) -> None:
        with self.stage(step, "checkpoint"):
            path = ckpt.save(self.out, self.wrapped, self.optimizer, self.info, step,
                             self.loader.position, config_dict(self.cfg))
        self.log(f"[ckpt] saved {path}")
        if self.info.is_master:  # after save's barrier: the checkpoint and `latest` are on disk
            protect = (Path(self.resumed_from),) if self.resumed_from else ()
            removed = ckpt.prune(self.out, self.cfg.train.keep_checkpoints, path, protect)
            if removed:
                self.log(f"[ckpt] removed {', '.join(p.name for p in removed)} (train.keep_checkpoints="
                         f"{self.cfg.train.keep_checkpoints})")

    def oom_report(self, exc: BaseException) -> None:
        path = self.out / f"oom_rank{self.info.rank}.txt"
        text = (f"out of memory on rank {self.info.rank} ({self.device}) {self.where()}, "
                f"stage {self.watchdog.stage}: {exc}\n")
        if self.device.type == "cuda":
            text += torch.cuda.memory_summary(self.device)
        path.write_text(text)
        self.log_all(f"[oom] out of memory {self.where()}; memory report in {path}")

    def close(self) -> None:
        """Stop the loader, close the files, stop the watchdog, destroy the process group."""
        self._closers.close()


def _described(exc: BaseException) -> str:
    """'OSError: [Errno 28] No space left on device: '/out/training.csv'': the type and the whole
    message (an OSError's repr leaves out the file it names)."""
    return f"{type(exc).__name__}: {exc}"


def _finite(v: float) -> bool:
    return v == v and v not in (float("inf"), float("-inf"))
