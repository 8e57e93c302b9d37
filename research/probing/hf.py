"""The key probe for Hugging Face causal LMs while they train: transformers' Trainer, or a loop of one's own.

    from research.probing.hf import KeyProbeCallback, KeyRecorder

    probe = KeyProbeCallback("run/results.json", probe_ids_BT, every=50)      # probe_ids_BT: [B, T] token ids
    Trainer(model, args, train_dataset=..., callbacks=[probe]).train()

    recorder = KeyRecorder("run/results.json", probe_ids_BT)                   # a loop of one's own
    for step in ...:
        ...
        if step % 50 == 0:
            recorder.record(model, step=step, tokens=tokens_seen, loss=mean_loss_since_last_probe)

    record_keys("run/results.json", model, probe_ids_BT, step=step, tokens=tokens_seen)   # or one call at a time

Each probe is one no-grad forward of the fixed batch (eval mode, RNG states restored, so probing
never changes training) and appends one record to results.json in the project's schema
(research/results/schema.py), rewritten atomically: per layer and KV head the key metrics
(research/probing/metrics.py) at k_norm (keys after the model's k_norm; for a family without one,
the raw projection, as this project's own probe records qk_norm='none'), k_proj (where the model has a
k_norm), k_hat (k_norm's output over its gain: the normalized keys before the gain) and k_rope (after
RoPE, as attention uses them); per query head the attention metrics (entropy, sink mass, logit
statistics) and the largest logit taken apart into scale, |q|, |k|, cosine and, where the model has q/k
norm gains, how much each gain lengthens its vector there; the q/k norm gains as the model applies them
(1 + w for Gemma) with their CV. The probe batch's next-token loss is the record's val_loss (the batch
is held-out text; 0 at step 0 is kept as init_val_loss, as this project's own probe does).

Attention statistics come from the queries and keys the model's attention receives, blockwise
(research.access.adapters wraps the attention function of the model's own implementation inside
the probe's forward only): the model keeps its SDPA or flash attention, computes its own output, and
never materializes a [T, T] matrix of all heads. The vocabulary's logits are never formed for the
whole batch either: the final hidden states go through the LM head in chunks.

Families: those research.access.adapters reads (Llama, Mistral, Qwen2, Qwen3, OLMo 2, Gemma 3,
GPT-2, Apertus, Arcee); any other is refused with ProbeError. Models wrapped by DDP, torch.compile or
PEFT are unwrapped. Sharded training (FSDP, DeepSpeed ZeRO-3) is refused: the probe needs the whole
model on the process that writes the file.
"""
from __future__ import annotations

import hashlib
import math
import numbers
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import TrainerCallback

from research.access.adapters import ADAPTERS, InspectError
from research.probing.metrics import attention_metrics, gamma_stats, key_metrics, layer_means
from research.probing.probe import as_lists, attention_record, measuring, unwrap
from research.results import ResultsError, add_probe, load_results, new_results, save_results, truncate
from research.results.vocabulary import PR, PRE_GAIN_SITES
from training.alarm import SpikeAlarm
from training.callbacks import StepInfo
from training.step_telemetry import squared_change
from utils.telemetry import parse_alarm
from utils.errors import ConfigError, UserError, shown

DEFAULT_EVERY = 50  # optimizer steps between probes
LOSS_CHUNK = 64  # positions whose vocabulary logits are formed at once for the probe batch's loss


class ProbeError(UserError, ValueError):
    """A model, a file or a training setup the probe cannot work with; the message says why and what to do."""


def _whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_probe_values(step, tokens, loss, step_name: str = "step") -> tuple[int, int, float | None]:
    """(step, tokens, loss) as the probe API records them, or ProbeError naming the argument, its value and the
    fix: step and tokens whole numbers >= 0 (not floats, not bools), loss a finite number or None."""
    for name, value, what in ((step_name, step, "optimizer steps done"), ("tokens", tokens, "training tokens seen")):
        if not _whole(value) or value < 0:
            raise ProbeError(f"{name}={shown(value, 40)} ({type(value).__name__}): give the number of {what} as a "
                             f"whole number >= 0 (an int, e.g. int({name}))")
    if loss is not None:
        ok = isinstance(loss, numbers.Real) and not isinstance(loss, bool) and math.isfinite(loss)
        if not ok:
            raise ProbeError(f"loss={shown(loss, 40)} ({type(loss).__name__}): give the mean training loss since the "
                             f"previous probe as a finite number, or None where there is none (a run whose loss "
                             f"became NaN or inf diverged: stop it rather than record it)")
        loss = float(loss)
    return int(step), int(tokens), loss


def base_model(model: nn.Module) -> nn.Module:
    """The Hugging Face model behind DDP, torch.compile and PEFT wrappers."""
    model = unwrap(model)
    get_base = getattr(model, "get_base_model", None)  # PEFT
    return unwrap(get_base()) if callable(get_base) else model


def adapter_for(model: nn.Module):
    """The inspection adapter of `model`'s family, keeping the model's attention implementation; ProbeError for a
    family no adapter reads."""
    model = base_model(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    cls = ADAPTERS.get(model_type)
    if cls is None:
        raise ProbeError(f"the key probe cannot read a model of type {model_type!r} ({type(model).__name__}): it "
                         f"reads {', '.join(sorted(ADAPTERS))}. Another family needs an adapter class in "
                         f"research/access/adapters.py that says where it keeps its keys")
    return cls(model, attn_implementation=None)


def qk_norm_kind(adapter) -> str:
    """'learned' (a k_norm whose gain trains), 'frozen' (a k_norm whose gain does not) or 'none' (no k_norm): the
    project's names of the three conditions, which results.json records per run."""
    k_norm = adapter.qk_norms(0)[1]
    weight = getattr(k_norm, "weight", None)
    if k_norm is None or weight is None:
        return "none"
    return "learned" if weight.requires_grad else "frozen"


def model_config(adapter) -> dict:
    """The model section of results.json's config for a Hugging Face model."""
    return {"model_type": adapter.model_type, "family": adapter.family, "n_layers": adapter.n_layers,
            "n_heads": adapter.n_heads, "n_kv_heads": adapter.n_kv_heads, "d_model": adapter.d_model,
            "d_head": adapter.head_dim, "qk_norm": qk_norm_kind(adapter)}


class _Sink:
    """The adapter's callbacks reduced, layer by layer, to a probe record; the model's own attention computes
    the output (on_attention returns None)."""

    def __init__(self, adapter):
        self.adapter = adapter
        self.pre: dict[int, dict[str, torch.Tensor]] = {}
        self.layers: list[dict] = []
        self.final: torch.Tensor | None = None

    def on_state(self, l: int, h_BTd: torch.Tensor) -> None:
        if l == self.adapter.n_layers:
            self.final = h_BTd

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.pre.setdefault(i, {})[site] = k_HBTD

    def on_queries(self, i: int, site: str, q_HBTD: torch.Tensor) -> None:
        self.pre.setdefault(i, {})[site] = q_HBTD

    def on_attention(self, i, q_BHTD, k_BKTD, v, scaling, window, softcap):
        t = self.pre.pop(i, {})
        q_norm, k_norm = self.adapter.qk_norms(i)
        g_q, g_k = self.adapter.gain(q_norm), self.adapter.gain(k_norm)
        q, k = q_BHTD.transpose(0, 1), k_BKTD.transpose(0, 1)                 # [H, B, T, D]
        with torch.autocast(q.device.type, enabled=False):  # metrics in full precision
            attn_m = attention_metrics(q, k, scale=scaling, window=window, softcap=softcap)
            pre_k = t.get("k_norm", t.get("k_proj"))
            sites = {"k_norm": pre_k, **({"k_proj": t["k_proj"]} if "k_norm" in t else {}), "k_rope": k}
            if g_k is not None and "k_norm" in t:
                gain = g_k.to(pre_k.device).reshape(-1, 1, 1, self.adapter.head_dim)   # [1 or Hkv, 1, 1, D]
                sites[PRE_GAIN_SITES["k_norm"]] = torch.where(gain != 0, pre_k.float() / gain, 0.0)
            both = g_q is not None and g_k is not None and "q_norm" in t and "k_norm" in t
            rec: dict = {"layer": i}
            means: dict[str, float] = {}
            for name, m in (*((s, key_metrics(x)) for s, x in sites.items()),
                            ("attn", attention_record(attn_m, t.get("q_norm"), pre_k, g_q if both else None,
                                                      g_k if both else None))):
                rec[name] = as_lists(m)
                means.update({f"{name}.{key}": v for key, v in layer_means(m).items()})
        rec["gamma_k"], rec["gamma_q"], rec["means"] = gamma_stats(g_k), gamma_stats(g_q), means
        self.layers.append(rec)
        return None


class HFKeyProbe:
    """Measures a Hugging Face causal LM's keys on a fixed batch of token ids [B, T]: a record in the form of
    research.probing.probe.KeyProbe's, plus `loss`, the batch's next-token loss (nats per token)."""

    def __init__(self, probe_ids_BT: torch.Tensor, precision: str = "fp32"):
        if not isinstance(probe_ids_BT, torch.Tensor) or probe_ids_BT.dim() != 2 or probe_ids_BT.shape[1] < 2:
            got = tuple(probe_ids_BT.shape) if isinstance(probe_ids_BT, torch.Tensor) else probe_ids_BT
            raise ProbeError(f"the probe batch must be token ids [B, T] with T >= 2, got {shown(got, 60)}")
        if precision not in ("fp32", "bf16"):
            raise ProbeError(f"precision {shown(precision)}: choose fp32 or bf16")
        self.ids = probe_ids_BT.long()
        self.precision = precision
        self.current = None

    @property
    def batch_sha256(self) -> str:
        """The probe batch's fingerprint: a resumed run must probe the same tokens."""
        return hashlib.sha256(self.ids.cpu().numpy().tobytes()).hexdigest()

    def adapter(self, model: nn.Module):
        base = base_model(model)
        if self.current is None or self.current.model is not base:
            try:
                adapter = adapter_for(base)
                adapter.check_window(self.ids.shape[1], "the probe batch's windows", "probe_ids_BT's length")
                adapter.check_token_ids(self.ids, "the probe batch")
            except InspectError as e:
                raise ProbeError(str(e)) from e
            self.current = adapter
        return self.current

    def _loss(self, adapter, h_BTd: torch.Tensor, ids: torch.Tensor) -> float:
        """Mean next-token loss from the last hidden states, LOSS_CHUNK positions of logits at a time."""
        h, target = h_BTd[:, :-1].flatten(0, 1), ids[:, 1:].flatten()
        total = 0.0
        for s in range(0, h.shape[0], LOSS_CHUNK):
            z = adapter.logits(h[s:s + LOSS_CHUNK].unsqueeze(0)).squeeze(0)
            total += F.cross_entropy(z, target[s:s + LOSS_CHUNK], reduction="sum").item()
        return total / target.numel()

    @torch.no_grad()
    def __call__(self, model: nn.Module) -> dict:
        adapter = self.adapter(model)
        base = adapter.model
        device = next(base.parameters()).device
        ids = self.ids.to(device)
        sink = _Sink(adapter)
        t0 = time.perf_counter()
        with measuring(base, device, self.precision), adapter.capture(sink):
            base(input_ids=ids, use_cache=False, logits_to_keep=1)  # the vocabulary's logits: below, in chunks
            loss = self._loss(adapter, sink.final, ids)
        layers = sorted(sink.layers, key=lambda r: r["layer"])
        if len(layers) != adapter.n_layers:
            raise ProbeError(f"the probe saw the attention of {len(layers)} of {adapter.n_layers} layers: the model's "
                             f"attention does not go through transformers' attention functions (a custom forward?)")
        return {"layers": layers, "mean_pr": sum(r["means"][PR] for r in layers) / len(layers),
                "probe_time_s": time.perf_counter() - t0, "batch": list(self.ids.shape),
                "precision": self.precision, "loss": loss}


class KeyRecorder:
    """results.json of a Hugging Face model's training, one probe at a time: what KeyProbeCallback writes, for a
    loop of one's own.

    The first record decides what happens to a file already at `path`: a run starting at step 0 refuses it
    (it holds another run's probes: nothing is overwritten); a run continuing at a step after the file's last
    probe appends to it, checked to be taken on the same probe batch and model shape, so the file reads as one
    run. Records only append: a step at or before the file's last probe is refused; only a resume from a
    checkpoint (`resume`, or record_keys' `resumed_at`) drops the probes after the checkpoint's step.
    `header`: new_results' other arguments (config, preset, seed, provenance, data), merged into what the
    recorder fills in itself."""

    def __init__(self, path: str | Path, probe_ids_BT: torch.Tensor, *, tag: str = "hf", precision: str = "fp32",
                 header: dict | None = None):
        self.path = Path(path)
        self.probe = HFKeyProbe(probe_ids_BT, precision)
        self.tag = tag
        self.header = dict(header or {})
        self.results: dict | None = None
        self.last_step: int | None = None

    def _fresh(self, adapter) -> dict:
        h = self.header
        config = {**(h.get("config") or {})}
        config["model"] = {**model_config(adapter), **(config.get("model") or {})}
        config.setdefault("probe", {})["probe_batch"] = int(self.probe.ids.shape[0])
        data = {**(h.get("data") or {}), "probe_batch_sha256": self.probe.batch_sha256,
                "probe_batch": list(self.probe.ids.shape)}
        return new_results(self.tag, config=config, preset=h.get("preset"), seed=h.get("seed"),
                           provenance=h.get("provenance"), data=data)

    def _open(self, step: int, adapter, resumed_at: int | None = None) -> dict:
        """The file at `path` to append the probe at `step` to (a fresh record where there is none). Records only
        append: a step at or before the file's last probe is refused, unless the run was resumed from a checkpoint
        at `resumed_at` (the explicit resume path: the probes after it are dropped, the run takes them again)."""
        if not self.path.exists():
            return self._fresh(adapter)
        fix = f"pass another path, or move {self.path} away"
        try:
            res = load_results(self.path)
        except ResultsError as e:
            raise ProbeError(f"{e}. The probe does not write over a file it cannot read: {fix}") from e
        if step == 0 and res["steps"] and resumed_at is None:
            raise ProbeError(f"{self.path} holds probes of another run (steps {res['steps'][0]}..{res['steps'][-1]}) "
                             f"and this run starts at step 0: {fix}")
        if (res.get("data") or {}).get("probe_batch_sha256") not in (None, self.probe.batch_sha256):
            raise ProbeError(f"{self.path} was written with another probe batch: a resumed run must probe the same "
                             f"tokens (build the batch as the run did), or {fix}")
        n_layers = len(res["probes"][0]["layers"]) if res["probes"] else adapter.n_layers
        if n_layers != adapter.n_layers or res["tag"] != self.tag:
            raise ProbeError(f"{self.path} is the results of {shown(res['tag'])} with {n_layers} layers, not of this "
                             f"run ({self.tag!r}, {adapter.n_layers} layers): {fix}")
        if resumed_at is not None:
            return truncate(res, resumed_at)
        last = res["steps"][-1] if res["steps"] else None
        if last is not None and step <= last:
            raise ProbeError(f"step {step}: {self.path} holds probes up to step {last}, and records only append (a "
                             f"step that goes back or repeats would replace probes already taken). Count steps from "
                             f"the start of training (a loop that restarts its counter each epoch: add the steps of "
                             f"the epochs before); a run resumed from a checkpoint: pass resumed_at=<its step> "
                             f"(KeyRecorder.resume, or record_keys(..., resumed_at=...)), which drops the probes "
                             f"after it; or {fix}")
        return res

    def record(self, model: nn.Module, *, step: int, tokens: int, loss: float | None = None,
               wall_time_s: float | None = None) -> dict:
        """Probe `model` after `step` optimizer steps and `tokens` training tokens; `loss`: the mean training loss
        since the previous probe (None at step 0). Rewrites results.json; returns the record."""
        check_probe_values(step, tokens, loss)  # before the forward: a bad value costs no probe
        return self.commit(self.measure(model), step=step, tokens=tokens, loss=loss, wall_time_s=wall_time_s)

    def measure(self, model: nn.Module) -> dict:
        """The probe's record of `model` now, written by `commit` (a Trainer's loss of the step comes later)."""
        record = self.probe(model)
        record["qk_norm"] = qk_norm_kind(self.probe.adapter(model))
        return record

    def commit(self, record: dict, *, step: int, tokens: int, loss: float | None = None,
               wall_time_s: float | None = None) -> dict:
        """Append a record of `measure` as the probe after `step` optimizer steps and rewrite results.json."""
        step, tokens, loss = check_probe_values(step, tokens, loss)
        if self.last_step is not None and step <= self.last_step:
            raise ProbeError(f"step {step}: this recorder's last probe was at step {self.last_step}, and records "
                             f"only append; pass the steps counted from the start of training, each probe's later "
                             f"than the one before")
        if self.results is None:
            self.results = self._open(step, self.probe.current)
        record = dict(record)
        val_loss, qk_norm = record.pop("loss"), record.pop("qk_norm")
        if step == 0:  # the model before training: the write-ups' val_loss starts at the first interval
            self.results["init_val_loss"], val_loss = val_loss, None
        add_probe(self.results, record, step=step, tokens=tokens, loss=loss, val_loss=val_loss,
                  wall_time_s=math.nan if wall_time_s is None else wall_time_s, qk_norm=qk_norm)
        save_results(self.path, self.results)
        self.last_step = step
        return record

    def resume(self, model: nn.Module, step: int, every: int) -> dict:
        """Continue results.json after a checkpoint at `step`, as this project's ProbeCallback does: the file must
        exist and hold the probe taken last before the checkpoint (at step - step % every); probes after `step`
        are dropped (the resumed run takes them again). Returns the file as kept."""
        fix = (f"restore {self.path.name} from a copy, or train again from step 0 into an empty folder (its probes "
               f"before step {step} cannot be rebuilt otherwise)")
        if not self.path.exists():
            raise ProbeError(f"cannot resume from step {step}: {self.path} is missing; {fix}")
        check_probe_values(step, 0, None)
        res = self._open(step + 1, self.probe.adapter(model), resumed_at=step)
        last = step - step % every
        if last not in res["steps"]:
            raise ProbeError(f"cannot resume from step {step}: {self.path} has no probe at step {last}; {fix}")
        self.results, self.last_step = res, res["steps"][-1]
        return res


def record_keys(path: str | Path, model: nn.Module, probe_ids_BT: torch.Tensor, *, step: int, tokens: int,
                loss: float | None = None, tag: str = "hf", header: dict | None = None,
                resumed_at: int | None = None) -> dict:
    """One probe appended to results.json at `path`, for a loop of one's own that keeps no recorder between
    probes: the file is read back each time (KeyRecorder's rules: a step-0 call never overwrites another run's
    probes, a step at or before the file's last is refused). `resumed_at`: the step of the checkpoint a resumed
    loop restarted from, on its first call after the resume: the probes after it are dropped (taken again).
    Returns the record."""
    recorder = KeyRecorder(path, probe_ids_BT, tag=tag, header=header)
    check_probe_values(step, tokens, loss)
    if resumed_at is not None:
        check_probe_values(resumed_at, 0, None, "resumed_at")
        if step <= resumed_at:
            raise ProbeError(f"step {step}, resumed_at {resumed_at}: the first probe after a resume comes after the "
                             f"checkpoint's step; pass the step the loop has reached")
        record = recorder.measure(model)
        recorder.results = recorder._open(step, recorder.probe.current, resumed_at=resumed_at)
        return recorder.commit(record, step=step, tokens=tokens, loss=loss)
    return recorder.record(model, step=step, tokens=tokens, loss=loss)


# What spike_alarm can watch on a Hugging Face Trainer's run: the gradient norm of its logs, and the RMS of the update
# its optimizer applies to the trainable weights (its one optimizer takes AdamW's signal name; the weights are copied
# before every optimizer step, only while that signal is watched)
HF_ALARM_SIGNALS = ("grad_norm", "update_rms_adamw")


def hf_spike_alarm(text: str) -> SpikeAlarm | None:
    """The spike alarm of KeyProbeCallback(spike_alarm=...): --spike_alarm's syntax and rule (utils.telemetry),
    ConfigError for a signal a Hugging Face Trainer's run does not give; the line is printed."""
    alarm = parse_alarm(text)
    if alarm is None:
        return None
    if alarm.signal.name not in HF_ALARM_SIGNALS:
        raise ConfigError(f"spike_alarm={shown(text)}: on a Hugging Face Trainer's run the alarm can watch "
                          f"{', '.join(HF_ALARM_SIGNALS)} (the gradient norm the Trainer logs, the RMS of the update "
                          f"its optimizer applies); {alarm.signal.name} is recorded by this project's own trainer "
                          f"only")
    return SpikeAlarm(alarm, record=lambda row: None, log=print)


def _sharded(args) -> str | None:
    """The kind of sharded training `args` (TrainingArguments) asks for, which the probe cannot follow."""
    if getattr(args, "fsdp", None):
        return "FSDP"
    if getattr(args, "deepspeed", None):
        return "DeepSpeed"
    return None


class KeyProbeCallback(TrainerCallback):
    """A transformers TrainerCallback that probes the keys at step 0, every `every` optimizer steps and at the last
    step, keeping results.json (research/results/schema.py) up to date; see the module doc.

    `loss` at a probe is the mean training loss of the steps since the previous probe, read from the Trainer's
    own logs: the callback asks the Trainer to log at every probe step (besides its logging_steps), so each
    window is exact. `tokens`: the Trainer's count (TrainingArguments(include_num_input_tokens_seen=True)),
    else `tokens_per_step` x step. Resuming (trainer.train(resume_from_checkpoint=...)) continues the file
    from the checkpoint's step: it must exist and hold the probe taken last before that step, as this
    project's own ProbeCallback requires; the loss window is rebuilt from the checkpoint's log history.
    Only the main process probes and writes. `spike_alarm` ("SIGNAL[:THRESHOLD]", HF_ALARM_SIGNALS; "none": off):
    at every Trainer log with a loss, the alarm of train_llm's --spike_alarm, printed and kept in results.json's
    "alarms" (a resumed run takes back those of its file, so it neither repeats nor loses one)."""

    def __init__(self, path: str | Path, probe_ids_BT: torch.Tensor, *, every: int = DEFAULT_EVERY,
                 tokens_per_step: int | None = None, tag: str = "hf", precision: str = "fp32",
                 header: dict | None = None, spike_alarm: str = "none"):
        self.spike = hf_spike_alarm(spike_alarm)
        self.before: list[torch.Tensor] | None = None  # the weights before the optimizer step (update_rms_adamw)
        self.update_rms: float | None = None
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ProbeError(f"every must be a whole number of optimizer steps >= 1, got {shown(every, 40)}")
        self.every, self.tokens_per_step = every, tokens_per_step
        self.recorder = KeyRecorder(path, probe_ids_BT, tag=tag, precision=precision, header=header)
        self.logged: list[tuple[int, float, int]] = []  # (step, mean loss, steps it covers) of the Trainer's logs
        self.pending: tuple[int, int, float, dict] | None = None  # (step, tokens, wall, record) awaiting its loss
        self.last_probe = 0
        self.t0, self.wall0 = time.perf_counter(), 0.0

    def _tokens(self, args, state) -> int:
        if getattr(args, "include_num_input_tokens_seen", "no") not in ("no", False, None):
            return int(state.num_input_tokens_seen)
        return state.global_step * self.tokens_per_step

    def _window_loss(self, end: int) -> float | None:
        """The mean training loss over the steps after the previous probe up to `end`, from the logs (each log's
        mean weighted by the steps it covers)."""
        inside = [(loss, n) for step, loss, n in self.logged if self.last_probe < step <= end]
        steps = sum(n for _, n in inside)
        return sum(loss * n for loss, n in inside) / steps if steps else None

    def _commit_pending(self) -> None:
        step, tokens, wall, record = self.pending
        if self.spike is not None and self.recorder.results is not None:
            self.recorder.results["alarms"] = list(self.spike.alarms)
        self.recorder.commit(record, step=step, tokens=tokens, loss=self._window_loss(step), wall_time_s=wall)
        self.last_probe, self.pending = step, None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        sharded = _sharded(args)
        if sharded:
            raise ProbeError(f"the key probe needs the whole model on the process that writes results.json; "
                             f"{sharded} shards it. Train with DDP or on one device to probe the keys")
        if getattr(args, "include_num_input_tokens_seen", "no") in ("no", False, None) and not self.tokens_per_step:
            raise ProbeError("the key probe records training tokens at each probe: pass TrainingArguments("
                             "include_num_input_tokens_seen=True), or tokens_per_step to KeyProbeCallback")
        self.t0 = time.perf_counter()
        self.logged, last = [], 0
        for entry in state.log_history:  # a resumed run's logs come back with its trainer_state.json
            if "loss" in entry and "step" in entry:
                self.logged.append((entry["step"], float(entry["loss"]), entry["step"] - last))
                last = entry["step"]
        if self.spike is not None:  # a resumed run: the logs before, so the first crossing is judged as it was
            for entry in state.log_history:
                if "loss" in entry and "step" in entry:
                    self.spike.rows.append({"grad_norm": entry.get("grad_norm")})
        if not state.is_world_process_zero:
            return
        if state.global_step == 0:
            self.recorder.record(model, step=0, tokens=0, wall_time_s=0.0)
            return
        res = self.recorder.resume(model, state.global_step, self.every)
        if self.spike is not None:
            self.spike.alarms = [a for a in res.get("alarms", []) if a["step"] <= state.global_step]
        self.last_probe = res["steps"][-1]
        walls = [w for w in res["wall_time_s"] if w is not None]
        self.wall0 = walls[-1] if walls else 0.0

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        control.should_log = True  # the loss window of this probe ends here: the Trainer logs it right after
        if state.is_world_process_zero:
            if self.pending is not None:  # its log never came (logging turned off by another callback)
                self._commit_pending()
            self.pending = (step, self._tokens(args, state), self.wall0 + time.perf_counter() - self.t0,
                            self.recorder.measure(model))

    def _watches_update(self) -> bool:
        return self.spike is not None and self.spike.alarm.signal.name == "update_rms_adamw"

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._watches_update():
            self.before = [p.detach().clone() for p in model.parameters() if p.requires_grad]

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if self._watches_update() and self.before is not None:
            after = [p.detach() for p in model.parameters() if p.requires_grad]
            squares = float(squared_change(after, self.before))
            n = sum(p.numel() for p in after)
            self.update_rms, self.before = (math.sqrt(squares / n) if n else None), None

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.spike is not None and logs and "loss" in logs:
            metrics = {"loss": logs["loss"], "grad_norm": logs.get("grad_norm"),
                       "update_rms": {"adamw": self.update_rms}}
            self.spike(StepInfo(step=state.global_step, total_steps=state.max_steps, start_step=0,
                                tokens=self._tokens(args, state), loss=logs["loss"], wall_time_s=0.0,
                                model=kwargs.get("model"), evaluate=lambda: math.nan,
                                is_main=state.is_world_process_zero, metrics=metrics))
        if logs and "loss" in logs:
            last = self.logged[-1][0] if self.logged else 0
            self.logged.append((state.global_step, float(logs["loss"]), state.global_step - last))
        if self.pending is not None and self.pending[0] == state.global_step:
            self._commit_pending()

    def on_train_end(self, args, state, control, **kwargs):
        if self.pending is not None:
            self._commit_pending()
