"""The declared formats (utils.formats specs) of the project's JSON and JSON-lines files that no reader of
research/results declares beside its own reading: a run's config.json, metrics.jsonl (one object per line) and
summary.json, the pilot's combined_results.json, the tour's inspect.json, the export's export.json, a storage's
stored.json and the GPU session's gpu_session.json. research.results.schema publishes them as JSON Schema with the
others (docs/schema/), and a test checks every stored folder's files against them. No torch.
"""
from __future__ import annotations

from research.results.checks import _CONFIG, PROVENANCE
from utils.formats import Bool, Integer, ListOf, MapOf, Number, Obj, OneOf, Opt, Scalar, Text, is_integer

_NAME = Text(nullable=False, nonempty=True)
_NUMBERS = ListOf(Number(), "a list of numbers or null")
_SECTION = Obj({})  # an object whose fields its own reader checks

# config.json of a run (configs.RunConfig.to_dict): the sections and values readers look into, as results.json's
# config holds them (research.results.checks); configs.files.run_config_from_dict checks the rest when a run is resumed.
RUN_CONFIG = Obj({**_CONFIG.fields, **{k: Obj(spec.fields, rules=spec.rules) for k, spec in _CONFIG.fields.items()
                                       if isinstance(spec, Obj)}}, "a JSON object (a run's config)")

# metrics.jsonl: one JSON object per logged step (training.trainer): a training line holds the loss and the step's
# telemetry (utils.telemetry), an evaluation line the validation loss, an alarm line the alarm (training.alarm).
METRICS_LINE = Obj({
    "step": Integer("a step (an integer >= 0)", nullable=False, lo=0),
    "tokens": Opt(Integer("a number of tokens (an integer >= 0)", nullable=False, lo=0)),
    **{k: Opt(Number()) for k in ("loss", "val_loss", "grad_norm", "lr_factor", "tokens_per_s", "wall_time",
                                  "z_loss")},
    "logit_max": Opt(ListOf(Number(), "one number per layer", nullable=True)),
    "key_norm": Opt(ListOf(Number(), "one number per layer", nullable=True)),
    "gate_closed": Opt(ListOf(Number(), "one share per layer", nullable=True)),
    "update_rms": Opt(MapOf(Number(), "an object of numbers per optimizer group", nullable=True)),
    "alarm": Opt(Obj({"signal": _NAME, "value": Number(), "threshold": Number()})),
}, "a JSON object (one line of metrics.jsonl)")

# summary.json of a run (training.trainer._summarize), with the provenance's fields (utils.runtime.provenance)
SUMMARY = Obj({
    "steps": Integer("a step (an integer >= 0)", nullable=False, lo=0),
    "tokens": Integer("a number of tokens", lo=0),
    **{k: Number() for k in ("final_loss", "final_val_loss", "wall_time_s", "tokens_per_s")},
    "precision": Text(), "world_size": Integer(lo=1),
    "alarms": Opt(ListOf(Obj({}), "a list of alarms (--spike_alarm)")),
    **{k: Opt(spec) for k, spec in PROVENANCE.fields.items()},
}, "a JSON object (a run's summary)")

# combined_results.json of the pilot (research.analysis.pilot.combined_from_runs): per condition, the seeds' means
# per probe (research.results.layout.runs_from_combined reads each entry as a results.json)
PILOT_COMBINED_FORMAT = MapOf(Obj({
    "tag": _NAME, "n_seeds": Integer(lo=1), "seeds": Opt(ListOf(Integer(), "a list of integers or null")),
    "tokens": ListOf(Number(nullable=False), "a list of numbers"),
    **{k: _NUMBERS for k in ("train_loss", "val_loss", "mean_pr")},
    **{k: Opt(MapOf(_NUMBERS, key_pattern=r"0|[1-9][0-9]*", key_kind="layer indices", nullable=True))
       for k in ("layer_pr", "gamma_cv")},
}), "an object mapping each condition to its seed means", path="dot", nonempty=True)

# inspect.json of research/inspect_pretrained.py (research.inspection.tour.inspect_model): the model and the
# sections of its tour, each read by the report that draws it.
INSPECT = Obj({
    "model": _NAME, "family": Text(), "model_type": Text(), "dtype": Text(),
    **{k: Integer("a positive integer", lo=1) for k in ("n_layers", "n_heads", "n_kv_heads", "head_dim", "d_model")},
    "prompt": Text(), "n_tokens": Opt(Integer(lo=0)), "token_ids": Opt(ListOf(Integer(), "a list of token ids")),
    **{k: Opt(_SECTION) for k in ("params", "weights", "attention", "hidden", "amplitude", "logit_lens", "keys",
                                  "dictionaries", "input_lens", "head_words", "memory", "context")},
    "time_s": Number("a number of seconds", ge=0),
}, "a JSON object (a pretrained model's tour)")

# export.json of research/export_hf.py (research.export.hf): what was exported, from which run and checkpoint
EXPORT = Obj({
    "source": _NAME, "checkpoint": _NAME, "step": Integer("a step (an integer >= 0)", nullable=False, lo=0),
    "tokens": Integer(lo=0), "qk_norm": _NAME, "architecture": _NAME,
    "embedding_scale_folded": Number(nullable=False, gt=0), "tie_word_embeddings": Bool(),
}, "a JSON object (an export's record)")

STORED_FILE = "stored.json"  # research.studies.storage.STORED
# stored.json of a run's storage (research.studies.storage): the run's files stored, relative to its folder, and its
# checkpoints' step folders, oldest first
STORED = Obj({
    "files": ListOf(Text("a path relative to the run folder (text)", nullable=False, nonempty=True),
                    "a list of relative paths"),
    "checkpoints": ListOf(Text("a step folder (text)", nullable=False, nonempty=True), "a list of step folders"),
}, "a JSON object (a storage's manifest)")

# gpu_session.json of research/speed/gpu_session.py: the device, the budget, each step's status, seconds and the
# last JSON object it printed; `session`: its number in the folder (absent: the first)
_STATUS = r"^(ran|skipped|failed \(exit -?[0-9]+\)|timeout \([0-9]+ s\))$"
_GPU_STEP = Obj({
    "status": Text("ran, skipped, failed (exit N) or timeout (N s)", nullable=False, pattern=_STATUS),
    "why": Opt(Text(nullable=False)), "seconds": Opt(Number("a number of seconds", nullable=False, ge=0)),
    "result": Opt(Obj({}, "the last JSON object the step printed, or null", nullable=True)),
    "aggregate_tokens_per_s": Opt(Integer("tokens per second (an integer)", nullable=False, lo=0)),
})
AUDIT_CHECKS = ("q_norm", "k_norm", "v_norm", "k_eq_v", "kv_share", "rope", "scale", "softcap")
AUDIT_STATUSES = ("as declared", "differs", "not measurable")
AUDIT_FINDING = Obj({
    "layer": Integer("a layer (an integer >= 0)", nullable=False, lo=0),
    "check": OneOf(AUDIT_CHECKS), "status": OneOf(AUDIT_STATUSES), "text": _NAME,
    **{k: Opt(Number()) for k in ("rms", "theta", "scaling", "scale")},
}, "a JSON object (one check of one layer)")
_AUDIT_SUMMARY = Obj({s: Integer("a count", nullable=False, lo=0) for s in AUDIT_STATUSES})
# qk-audit --json FILE (research/audit/command.py): every check of every layer, and how many ended each way; with
# --reference the reference's too, and where the two part (null: nowhere)
AUDIT = Obj({
    "model": Text("the MODEL argument, or null"), "factory": Text("--factory, or null"), "family": _NAME,
    "layers": Integer("layers (an integer >= 1)", nullable=False, lo=1),
    "tokens": ListOf(Integer("an integer >= 1", nullable=False, lo=1), "[sequences, tokens]", n=2),
    "findings": ListOf(AUDIT_FINDING, "a list of findings"), "summary": _AUDIT_SUMMARY,
    "reference": Opt(Obj({"model": _NAME, "findings": ListOf(AUDIT_FINDING, "a list of findings"),
                          "summary": _AUDIT_SUMMARY})),
    "comparison": Opt(Obj({"parting": Obj({"layer": Integer("a layer", nullable=False, lo=0),
                                           "site": OneOf(("q", "k", "v", "out")), "difference": Number()},
                                          "where the two part, or null", nullable=True),
                           "text": _NAME})),
}, "a JSON object (a qk-audit record)")
_MAYBE = Number("a number, or null")
DECIDE_HOW = ("paired by seed", "unpaired (Welch)", "described")
_SEED = Scalar(lambda v: is_integer(v) or (isinstance(v, str) and bool(v)), "a seed (an integer or a name)", False,
               schema={"type": ["integer", "string"]})
DECIDE_COMPARISON = Obj({
    "metric": _NAME, "a": _NAME, "b": _NAME, "how": OneOf(DECIDE_HOW), "family": _NAME,
    "k": Integer("the family's comparisons with an interval", nullable=False, lo=0),
    "n": Integer("seeds (or runs) compared", nullable=False, lo=0),
    "runs": ListOf(Integer(nullable=False, lo=0), "[runs of A, runs of B]", n=2),
    **{k: _MAYBE for k in ("mean_a", "mean_b", "difference", "estimate", "ci_level", "margin", "margin_share", "t",
                          "p", "p_one_sided")},
    "on": OneOf(("difference", "ratio")), "ci": ListOf(_MAYBE, "[low, high]", n=2), "outcome": _NAME,
    "seeds": ListOf(_SEED, "the seeds paired, or null", nullable=True),
    "unpaired_seeds": ListOf(_SEED, "seeds in one side only"),
    "note": Text(nullable=False),
}, "a JSON object (one comparison)")
_LOOK = Obj({"seeds": ListOf(_SEED, "a look's seeds", nullable=False), "alpha": Number(nullable=False, gt=0),
             "planned": Bool(nullable=False)}, "a JSON object (one look)")
# qk-decide --json FILE (research/decide/report.py): every comparison, the family it was decided in, what was left
# out, the looks of its design (null: none)
DECIDE = Obj({
    "tool": OneOf(("qk-decide",)), "sources": ListOf(_NAME, "the files read"),
    "conditions": ListOf(_NAME, "the conditions"), "metrics": ListOf(_NAME, "the metrics"),
    "step": Integer("the runs' step, or null", lo=0), "family": Obj({}, "the family as given"),
    "comparisons": ListOf(DECIDE_COMPARISON, "a list of comparisons"),
    "left_out": ListOf(_NAME, "one line per value left out"),
    "looks": ListOf(_LOOK, "the design's looks, or null", nullable=True),
}, "a JSON object (a qk-decide record)")
# qk-decide --design FILE (research/decide/design.py): the plan fixed at the first look and each look taken
DECIDE_DESIGN_FORMAT = Obj({
    "tool": OneOf(("qk-decide",)), "first_seeds": ListOf(_SEED, "the first look's seeds", nullable=False),
    "max_seeds": Integer("MAX (an integer >= 2)", nullable=False, lo=2),
    "round": Integer("seeds a round (an integer >= 1)", nullable=False, lo=1),
    "alpha": Number(nullable=False, gt=0), "rho": Number(nullable=False, gt=0),
    "first": Number(nullable=False, gt=0), "family": Obj({}, "the family fixed at the first look", nullable=False),
    "looks": ListOf(_LOOK, "the looks taken", nullable=False),
}, "a JSON object (a qk-decide design)")
GPU_SESSION = Obj({
    "session": Opt(Integer("the session's number in its folder (1, 2, ...)", nullable=False, lo=1)),
    "device": _NAME, "torch": _NAME, "budget_s": Number("a positive number of seconds", nullable=False, gt=0),
    "steps": MapOf(_GPU_STEP, "an object mapping each step to its record", path="dot"),
}, "a JSON object (a GPU session's record)")
