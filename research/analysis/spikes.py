"""Loss spikes, defined once, and whether a per-step signal warns before them (the spike-warning study). No torch.

The spike rule (`find_spikes`), on the training loss of every step (metrics.jsonl, --log_every 1):

- the line at step t is median + K x dispersion of the WINDOW steps before t, the dispersion being 1.4826 x their
  median absolute deviation (the standard deviation for normal noise, unmoved by one wild step), at least
  REL_FLOOR of the median;
- step t is a spike's onset when the loss of t and of the M - 1 steps after it all lie above the line of t;
- warm-up: no onset before the window is full (the first WINDOW steps);
- refractory: after an onset no other onset until the loss is back under the line (of its own window);
- a non-finite loss is the extreme case, divergence: a spike at its step (unless one is under way), and the run's
  end.

Signals (utils.telemetry.SIGNALS, read with its `series`; entropy from results.json's probes) raise an alarm at
each crossing of a threshold (utils.telemetry.Alarm.crossed), armed from the end of the warm-up on. An alarm
HITS a spike when it falls in the HORIZON steps before its onset; the lead time is the onset minus the first alarm
in that window. An alarm is FALSE when no onset follows within HORIZON steps; alarms during a spike (from its
onset to its end) are neither, and where the run ended (without diverging) less than HORIZON steps later they
cannot be judged and are not counted, nor are those steps. False alarms are per 1,000 judged steps.

Thresholds are chosen on the calibration seeds (the first half of the study's seeds), per signal and condition:
the candidate (a quantile of the signal over those runs) with the highest hit rate whose false alarms stay under
FALSE_ALARM_BOUND per 1,000 steps, fewest false alarms among ties. They are evaluated only on the other seeds: each
measure is a mean over the evaluation seeds with its t interval. A signal WARNS when its hit rate beats chance by
an interval wholly above 0 (per seed; Bonferroni over the signals of the condition, as research.analysis.rules).
Chance is what alarms at the same rate, placed at random, would hit: in a run that fires r alarms per judged step,
1 - (1 - r)^HORIZON of its spikes, each run at its own rate (a signal that fires only in the runs at the higher
learning rate, where most spikes are, is held to those runs' rate, not to its seed's average). It DOES NOT WARN when
the interval lies below MIN_EXCESS (or no threshold keeps its false alarms under the bound); otherwise, or with
fewer than MIN_SPIKES held-out spikes or 2 evaluation seeds with a spike, it is INCONCLUSIVE. docs/spikes.md says
why these constants.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import ALPHA
from research.analysis.stats import mean_ci
from research.results.values import as_float
from research.results.vocabulary import LR_CONDITIONS, split_grid_key
from utils.telemetry import SIGNALS, Alarm, series

# ---------------------------------------------------------------------------------- the spike rule
WINDOW = 20  # steps of the running median: enough for a steady MAD, short against the loss's decay
K = 5.0  # robust dispersions above the median: far outside step-to-step noise (normal: p < 3e-7 per step)
M = 2  # consecutive steps above the line: one bad batch is not a spike, a loss that stays up is
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal noise
REL_FLOOR = 1e-3  # the dispersion is at least this share of the median: a flat loss does not fire on rounding

# ---------------------------------------------------------------------------------- the evaluation
HORIZON = 10  # steps before an onset in which an alarm counts as a warning
FALSE_ALARM_BOUND = 20.0  # false alarms per 1,000 steps a calibrated threshold may give on the calibration seeds
MIN_EXCESS = 0.25  # a hit rate less than this above chance is no useful warning: "does not warn"
MIN_SPIKES = 4  # held-out spikes a verdict needs
WARNS, NO_WARNING, INCONCLUSIVE = "warns", "does not warn", "inconclusive"
ALIGN = (-2 * HORIZON, HORIZON)  # steps around the onset the figures show


@dataclass(frozen=True)
class Spike:
    onset: int  # step
    end: int  # the last step of the spike (the run's last for one that never came back or diverged)
    diverged: bool  # the loss became non-finite


def line(window: np.ndarray) -> float:
    """median + K x robust dispersion of the losses in `window`."""
    med = float(np.median(window))
    disp = max(MAD_SCALE * float(np.median(np.abs(window - med))), REL_FLOOR * abs(med))
    return med + K * disp


def find_spikes(steps, loss) -> list[Spike]:
    """The spikes of one run's per-step loss (`steps` ascending, one per step; NaN or inf: divergence)."""
    steps, loss = list(steps), np.asarray(loss, dtype=float)
    out: list[Spike] = []
    onset = None
    for i in range(len(loss)):
        if not math.isfinite(loss[i]):
            if onset is None:
                out.append(Spike(steps[i], steps[i], True))
            else:
                out[-1] = Spike(onset, steps[i], True)
            return out
        if i < WINDOW:
            continue
        bar = line(loss[i - WINDOW:i])
        if onset is not None:
            if loss[i] <= bar:
                onset = None
            else:
                out[-1] = Spike(onset, steps[i], False)
            continue
        ahead = loss[i:i + M]
        if len(ahead) == M and (np.all(ahead > bar) or (not math.isfinite(ahead[-1]) and np.all(ahead[:-1] > bar))):
            onset = steps[i]
            out.append(Spike(onset, steps[i], False))
    return out


# ---------------------------------------------------------------------------------- one run
@dataclass(frozen=True)
class RunSteps:
    """One run's per-step record: its loss, spikes and signals."""

    condition: str
    multiplier: float
    seed: object
    steps: tuple  # every logged step, ascending
    loss: tuple
    spikes: tuple  # Spike
    signals: dict  # signal name -> (steps, values) where it has a value

    @staticmethod
    def of(name: str, res: dict, rows: list[dict]) -> "RunSteps":
        """From a run's results.json (seed, divergence, probes) and its metrics.jsonl training lines."""
        cond, m = split_grid_key(name) if "@" in name else (name, 1.0)
        rows = sorted(rows, key=lambda r: r["step"])
        steps = [r["step"] for r in rows]
        loss = [as_float(r.get("loss")) for r in rows]
        diverged = (res.get("diverged") or {}).get("step")
        if diverged is not None and (not steps or steps[-1] < diverged):
            steps, loss = steps + [diverged], loss + [math.nan]  # the trainer stops before logging that step
        signals = {}
        for name_ in SIGNALS:
            if SIGNALS[name_].per_step:
                values = series(name_, rows)
                signals[name_] = tuple(zip(*[(s, v) for s, v in zip(steps, values) if v is not None])) or ((), ())
        signals["entropy"] = entropy_series(res)
        return RunSteps(cond, m, res.get("seed"), tuple(steps), tuple(loss), tuple(find_spikes(steps, loss)),
                        signals)

    @property
    def first_armed(self) -> int | None:
        return self.steps[WINDOW] if len(self.steps) > WINDOW else None

    @functools.cached_property
    def judged(self) -> frozenset:
        """The steps at which an alarm is judged: armed, not in a spike, its next HORIZON steps seen (or the run
        diverged)."""
        if self.first_armed is None:
            return frozenset()
        diverged = bool(self.spikes) and self.spikes[-1].diverged
        inside = {s for sp in self.spikes for s in range(sp.onset, sp.end + 1)}
        return frozenset(s for s in self.steps if s >= self.first_armed and s not in inside
                         and (diverged or s + HORIZON <= self.steps[-1]))


def entropy_series(res: dict) -> tuple:
    """(probe steps, the lowest per-layer mean attention entropy at each): the probe's attn.entropy per query head."""
    out = []
    for probe in res.get("probes") or []:
        means = [float(np.mean(v)) for rec in probe.get("layers") or []
                 if (v := [as_float(x) for x in (rec.get("attn") or {}).get("entropy") or []])
                 and all(math.isfinite(x) for x in v)]
        if means and probe.get("step") is not None:
            out.append((probe["step"], min(means)))
    return tuple(zip(*out)) or ((), ())


def alarms(run: RunSteps, signal: str, threshold: float) -> list[int]:
    """The steps at which `signal` crosses `threshold`, from the end of the warm-up on."""
    armed = run.first_armed
    if armed is None:
        return []
    alarm = Alarm(SIGNALS[signal], threshold)
    steps, values = run.signals[signal]
    return [s for i, (s, v) in enumerate(zip(steps, values))
            if s >= armed and alarm.crossed(v, values[i - 1] if i else None)]


@dataclass(frozen=True)
class Score:
    """What one threshold does on some runs: counts, summed."""

    spikes: int = 0
    hits: int = 0
    false_alarms: int = 0
    alarms: int = 0  # alarms at judged steps (true and false)
    judged_steps: int = 0
    leads: tuple = ()
    chance_hits: float = 0.0  # hits expected of random alarms, each run's at that run's own alarm rate

    def __add__(self, o: "Score") -> "Score":
        return Score(self.spikes + o.spikes, self.hits + o.hits, self.false_alarms + o.false_alarms,
                     self.alarms + o.alarms, self.judged_steps + o.judged_steps, self.leads + o.leads,
                     self.chance_hits + o.chance_hits)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.spikes if self.spikes else math.nan

    @property
    def false_per_1000(self) -> float:
        return 1000 * self.false_alarms / self.judged_steps if self.judged_steps else math.nan

    @property
    def chance(self) -> float:
        """The hit rate of random alarms at the same rate: in each run, alarms at r per judged step, placed at
        random, hit a spike with probability 1 - (1 - r)^HORIZON; this is their expected hits over the spikes."""
        return self.chance_hits / self.spikes if self.spikes else math.nan


def score(run: RunSteps, signal: str, threshold: float) -> Score:
    """Hits, lead times and false alarms of one threshold on one run (the module docstring's definitions)."""
    fired = alarms(run, signal, threshold)
    onsets = [s.onset for s in run.spikes]
    leads = []
    for o in onsets:
        before = [a for a in fired if o - HORIZON <= a < o]
        if before:
            leads.append(o - before[0])
    counted = [a for a in fired if a in run.judged]
    false = [a for a in counted if not any(a < o <= a + HORIZON for o in onsets)]
    rate = min(1.0, len(counted) / len(run.judged)) if run.judged else 0.0
    return Score(len(onsets), len(leads), len(false), len(counted), len(run.judged), tuple(leads),
                 len(onsets) * (1 - (1 - rate) ** HORIZON))


def total(runs: list[RunSteps], signal: str, threshold: float) -> Score:
    return sum((score(r, signal, threshold) for r in runs), Score())


# ---------------------------------------------------------------------------------- calibration
def candidates(runs: list[RunSteps], signal: str) -> np.ndarray:
    """The thresholds tried: 99 quantiles of the signal's values over the runs."""
    values = np.array([v for r in runs for v in r.signals[signal][1]], dtype=float)
    values = values[np.isfinite(values)]
    return np.unique(np.quantile(values, np.linspace(0.01, 0.99, 99))) if values.size else np.array([])


def calibrate(runs: list[RunSteps], signal: str) -> tuple[float | None, Score | None]:
    """(threshold, its score on `runs`): the highest hit rate with false alarms under FALSE_ALARM_BOUND per 1,000
    steps, fewest false alarms among ties; (None, None) when there is no spike or no threshold stays under it."""
    if not sum(len(r.spikes) for r in runs):
        return None, None
    best = None
    for t in candidates(runs, signal):
        s = total(runs, signal, float(t))
        if not s.false_per_1000 <= FALSE_ALARM_BOUND:
            continue
        if best is None or (s.hit_rate, -s.false_per_1000) > (best[1].hit_rate, -best[1].false_per_1000):
            best = (float(t), s)
    return best or (None, None)


# ---------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int  # evaluation seeds it rests on

    @staticmethod
    def of(values, level: float, lo: float = -math.inf, hi: float = math.inf) -> "Interval":
        """The mean of the finite values and its t interval at `level`, cut to what the measure can be [lo, hi]."""
        x = [v for v in values if math.isfinite(v)]
        mean, half = mean_ci(x, level)
        return Interval(mean, max(lo, mean - half), min(hi, mean + half), len(x))


@dataclass(frozen=True)
class SignalResult:
    signal: str
    condition: str
    threshold: float | None
    calibration: Score | None
    per_seed: dict  # evaluation seed -> Score
    hit_rate: Interval | None
    false_alarms: Interval | None  # per 1,000 steps
    lead: Interval | None  # steps
    chance: Interval | None  # hit rate of random alarms at the same rate
    excess: Interval | None  # hit rate - chance, per seed
    verdict: str
    text: str  # the verdict sentence with the estimates it rests on

    @property
    def eval_spikes(self) -> int:
        return sum(s.spikes for s in self.per_seed.values())


@dataclass(frozen=True)
class SpikeAnalysis:
    runs: tuple  # RunSteps
    conditions: list[str]
    calibration_seeds: list
    evaluation_seeds: list
    results: dict  # (signal, condition) -> SignalResult
    aligned: dict  # (signal or "loss", condition) -> [n_spikes, offsets] array around each onset
    level: dict  # condition -> the intervals' level (Bonferroni over its tested signals)
    summary: dict  # condition -> the sentence on the whole condition ("no signal warns" where none does)

    def spikes_of(self, condition: str, seeds=None) -> int:
        return sum(len(r.spikes) for r in self.runs if r.condition == condition and (seeds is None or r.seed in seeds))


STEPS = "metrics_steps"  # where the study's loader keeps each run's metrics.jsonl lines, beside its results


@dataclass(frozen=True)
class SpikeRuns:
    """What the study's folder holds: runs (name -> [results dict with its STEPS lines]) and the seeds in the order
    the study was given them (the first half calibrates)."""

    runs: dict
    seeds: list | None = None


def analyze_runs(inputs: SpikeRuns, margin: float | None = None, loss_margin: float | None = None) -> SpikeAnalysis:
    """analyze() on a study folder's runs (the margins of the other kinds do not apply here)."""
    return analyze([RunSteps.of(name, res, res[STEPS]) for name, rl in inputs.runs.items() for res in rl],
                   inputs.seeds)


def split_seeds(seeds: list) -> tuple[list, list]:
    """The first half of the seeds calibrates, the rest evaluate (one seed: it calibrates, nothing evaluates)."""
    n = max(1, len(seeds) // 2)
    return list(seeds[:n]), list(seeds[n:])


def ci_text(i: Interval | None, f: str = ".2f") -> str:
    if i is None or not math.isfinite(i.mean):
        return "n/a"
    if not math.isfinite(i.lo):
        return f"{i.mean:{f}} (one seed)"
    return f"{i.mean:{f}} [{i.lo:{f}}, {i.hi:{f}}]"


def _decide(signal: str, cond: str, threshold, cal: Score | None, per_seed: dict, level: float,
            cal_seeds: list, eval_seeds: list) -> SignalResult:
    scores = list(per_seed.values()) if threshold is not None else []  # no threshold: nothing was measured
    hit = Interval.of([s.hit_rate for s in scores], level, 0, 1)
    fa = Interval.of([s.false_per_1000 for s in scores], level, 0)
    lead = Interval.of([float(np.mean(s.leads)) if s.leads else math.nan for s in scores], level, 1, HORIZON)
    chance = Interval.of([s.chance for s in scores if s.spikes], level, 0, 1)
    excess = Interval.of([s.hit_rate - s.chance for s in scores if s.spikes], level, -1, 1)
    every = list(per_seed.values())
    n_spikes, seeds_with = sum(s.spikes for s in every), sum(1 for s in every if s.spikes)
    where = (f"threshold {threshold:.4g} chosen on seeds {', '.join(map(str, cal_seeds))}, evaluated on seeds "
             f"{', '.join(map(str, eval_seeds))}") if threshold is not None else ""
    if not eval_seeds:
        verdict, why = INCONCLUSIVE, "no seed to evaluate on: the study needs 2 seeds or more"
    elif n_spikes < MIN_SPIKES or seeds_with < 2:
        verdict, why = INCONCLUSIVE, (f"{n_spikes} held-out spike(s) on {seeds_with} seed(s); a verdict needs "
                                      f"{MIN_SPIKES} on 2 seeds or more")
    elif threshold is None:
        verdict, why = NO_WARNING, (f"no threshold kept its false alarms under {FALSE_ALARM_BOUND:g} per 1,000 steps "
                                    f"on the calibration seeds")
    elif excess.lo > 0:
        verdict, why = WARNS, ""
    elif excess.hi < MIN_EXCESS:
        verdict, why = NO_WARNING, ""
    else:
        verdict, why = INCONCLUSIVE, "the interval of its hit rate above chance reaches both sides"
    est = (f"held-out hit rate {ci_text(hit)} against {ci_text(chance)} by chance at its alarm rate (excess "
           f"{ci_text(excess)}), {ci_text(fa, '.1f')} false alarms per 1,000 steps, lead {ci_text(lead, '.1f')} steps, "
           f"{n_spikes} spike(s)")
    text = f"{signal} {verdict} in {cond}" + (f" ({why})" if why else "") + (
        f": {est}; {where}" if threshold is not None else "") + "."
    return SignalResult(signal, cond, threshold, cal, per_seed, hit, fa, lead, chance, excess, verdict, text)


def aligned(runs: list[RunSteps], name: str) -> np.ndarray:
    """[n_spikes, offsets]: the signal (or "loss") at ALIGN[0]..ALIGN[1] steps from each onset (NaN where none)."""
    offsets = np.arange(ALIGN[0], ALIGN[1] + 1)
    out = []
    for r in runs:
        steps, values = (r.steps, r.loss) if name == "loss" else r.signals[name]
        at = dict(zip(steps, values))
        for s in r.spikes:
            out.append([as_float(at.get(s.onset + o)) for o in offsets])
    return np.array(out, dtype=float).reshape(len(out), offsets.size)


def analyze(runs: list[RunSteps], seeds: list | None = None) -> SpikeAnalysis:
    """Calibrate on the first half of `seeds` (default: the runs' seeds, sorted), evaluate on the rest, per signal
    and condition."""
    seeds = list(seeds) if seeds else sorted({r.seed for r in runs if r.seed is not None})
    cal_seeds, eval_seeds = split_seeds(seeds) if len(seeds) > 1 else (seeds, [])
    present = {r.condition for r in runs}
    conditions = [c for c in LR_CONDITIONS if c in present] + sorted(present - set(LR_CONDITIONS))
    results, levels, summary, al = {}, {}, {}, {}
    for cond in conditions:
        of = [r for r in runs if r.condition == cond]
        cal_runs = [r for r in of if r.seed in cal_seeds]
        chosen = {sig: calibrate(cal_runs, sig) for sig in SIGNALS}
        per_seed = {sig: {seed: total([r for r in of if r.seed == seed], sig, t) for seed in eval_seeds}
                    if t is not None else {seed: Score(spikes=sum(len(r.spikes) for r in of if r.seed == seed))
                                           for seed in eval_seeds}
                    for sig, (t, _) in chosen.items()}
        tested = sum(1 for sig, (t, _) in chosen.items() if t is not None
                     and sum(1 for s in per_seed[sig].values() if s.spikes) >= 2)
        levels[cond] = 1 - ALPHA / max(tested, 1)
        cal_spikes = sum(len(r.spikes) for r in cal_runs)
        for sig, (t, cal) in chosen.items():
            res = _decide(sig, cond, t, cal, per_seed[sig], levels[cond], cal_seeds, eval_seeds)
            if not candidates(of, sig).size:
                res = _undecided(res, "not recorded in its runs")
            elif t is None and not cal_spikes:
                res = _undecided(res, f"the calibration seeds ({', '.join(map(str, cal_seeds))}) had no spike, so "
                                      f"no threshold was chosen")
            results[(sig, cond)] = res
        summary[cond] = _summary(cond, [results[(sig, cond)] for sig in SIGNALS])
        for name in ("loss", *SIGNALS):
            al[(name, cond)] = aligned(of, name)
    return SpikeAnalysis(tuple(runs), conditions, cal_seeds, eval_seeds, results, al, levels, summary)


def _summary(cond: str, results: list[SignalResult]) -> str:
    """The condition in one sentence: the signals that warn, else "no signal warns", and those undecided."""
    warned = [r.signal for r in results if r.verdict == WARNS]
    open_ = [r.signal for r in results if r.verdict == INCONCLUSIVE]
    head = (f"In {cond}, {', '.join(warned)} warn{'s' if len(warned) == 1 else ''}" if warned
            else f"In {cond}, no signal warns")
    return head + (f"; inconclusive: {', '.join(open_)}." if open_ else ".")


def _undecided(res: SignalResult, why: str) -> SignalResult:
    """A signal that could not be calibrated: inconclusive, and why."""
    return dataclasses.replace(res, verdict=INCONCLUSIVE, text=f"{res.signal} {INCONCLUSIVE} in {res.condition} "
                               f"({why}).")
