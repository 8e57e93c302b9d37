"""Loss spikes, defined once, and what an alarm on a per-step signal does around them (research/analysis/spikes.py
decides whether it warns). No torch.

`find_spikes`: the spike rule on the training loss of every step (metrics.jsonl, --log_every 1), with its
constants WINDOW, K, REL_FLOOR and M; a non-finite loss is a spike that ends the run. Signals (utils.telemetry)
raise an alarm at each crossing of a threshold, armed from the end of the warm-up on. `RunSteps` holds one run:
its spikes' warning windows (HORIZON steps before an onset) and reaction spans (REACTION steps after an end), and
the alarms that hit a spike, react to one, or are false. CHECKS are LOSS_RISE and LATE_LOSS_RISE.
Each definition in words: docs/spikes.md, "The spike rule" and "Alarms, hits, false alarms, lead time".
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from research.results.values import as_float
from research.results.vocabulary import split_grid_key
from utils.telemetry import STUDIED, Signal, series

# ---------------------------------------------------------------------------------- the spike rule
WINDOW = 20  # steps of the running median: enough for a steady MAD, short against the loss's decay
K = 5.0  # robust dispersions above the median: far outside step-to-step noise (normal: p < 3e-7 per step)
M = 2  # consecutive steps above the line: one bad batch is not a spike, a loss that stays up is
MAD_SCALE = 1.4826  # MAD -> standard deviation for normal noise
REL_FLOOR = 1e-3  # the dispersion is at least this share of the median: a flat loss does not fire on rounding

HORIZON = 10  # steps before an onset in which an alarm counts as a warning
# Steps after a spike's end through which an alarm is a reaction to it: a signal that rises with the loss comes back
# with it and may cross again while it settles, and within as many steps as a warning may lead, a late reaction and
# an early warning of the next spike cannot be told apart; the rule calls it a reaction. REACTION >= HORIZON - 1 also
# keeps every warning window one run of steps.
REACTION = HORIZON
LOSS_RISE, LATE_LOSS_RISE = "loss_rise", "late_loss_rise"
CHECKS = {s.name: s for s in (  # go through the same calibration and test as the signals, outside their family
    Signal(LOSS_RISE, f"the loss minus the median of its {WINDOW} steps before"),
    Signal(LATE_LOSS_RISE, f"{LOSS_RISE} as it was {REACTION} steps before: a negative control"),
)}


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
        for name_ in STUDIED:
            if STUDIED[name_].per_step:
                values = series(name_, rows)
                signals[name_] = tuple(zip(*[(s, v) for s, v in zip(steps, values) if v is not None])) or ((), ())
        signals["entropy"] = entropy_series(res)
        return RunSteps(cond, m, res.get("seed"), tuple(steps), tuple(loss), tuple(find_spikes(steps, loss)),
                        signals)

    @property
    def first_armed(self) -> int | None:
        return self.steps[WINDOW] if len(self.steps) > WINDOW else None

    @functools.cached_property
    def step_array(self) -> np.ndarray:
        return np.asarray(self.steps, dtype=np.int64)

    @functools.cached_property
    def onsets(self) -> np.ndarray:
        return np.array([s.onset for s in self.spikes], dtype=np.int64)

    @functools.cached_property
    def windows(self) -> np.ndarray:
        """[spikes, 2]: each spike's warning window, steps lo to hi - 1 (empty where lo >= hi): the HORIZON steps
        before its onset, from the first armed step on and after the previous spike's end + REACTION."""
        out = np.zeros((len(self.spikes), 2), dtype=np.int64)
        floor = self.first_armed
        for i, sp in enumerate(self.spikes):
            lo = sp.onset if floor is None else max(sp.onset - HORIZON, floor)
            out[i] = lo, sp.onset
            floor = None if floor is None else max(floor, sp.end + REACTION + 1)
        return out

    @functools.cached_property
    def warnable(self) -> np.ndarray:
        """Per spike: its warning window holds a step (else no alarm can warn of it and it is not counted)."""
        return self.windows[:, 0] < self.windows[:, 1]

    @functools.cached_property
    def reaction_mask(self) -> np.ndarray:
        """At each step: it lies from a spike's onset to REACTION steps after its end (an alarm there is a reaction)."""
        s = self.step_array
        out = np.zeros(s.size, bool)
        for sp in self.spikes:
            out |= (s >= sp.onset) & (s <= sp.end + REACTION)
        return out

    @functools.cached_property
    def judged_mask(self) -> np.ndarray:
        """At each step: an alarm there is judged (armed, no reaction, its next HORIZON steps seen or the run
        diverged)."""
        s = self.step_array
        if self.first_armed is None:
            return np.zeros(s.size, bool)
        diverged = bool(self.spikes) and self.spikes[-1].diverged
        return (s >= self.first_armed) & (diverged or (s + HORIZON <= s[-1])) & ~self.reaction_mask

    @property
    def judged(self) -> frozenset:
        return frozenset(self.step_array[self.judged_mask].tolist())

    @functools.cached_property
    def warned_mask(self) -> np.ndarray:
        """At each step: it lies in a spike's warning window (an alarm there hits, and is not false)."""
        s = self.step_array
        out = np.zeros(s.size, bool)
        for lo, hi in self.windows:
            out |= (s >= lo) & (s < hi)
        return out


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


def loss_rise(run: RunSteps) -> tuple:
    """(steps, the loss minus the median of its WINDOW steps before) from the end of the warm-up, finite only."""
    loss = np.asarray(run.loss, dtype=float)
    if loss.size <= WINDOW:
        return (), ()
    med = np.median(np.lib.stride_tricks.sliding_window_view(loss[:-1], WINDOW), axis=1)
    rise = loss[WINDOW:] - med
    keep = np.isfinite(rise)
    return tuple(run.step_array[WINDOW:][keep].tolist()), tuple(rise[keep].tolist())


def late_loss_rise(run: RunSteps, rise: tuple | None = None) -> tuple:
    """(steps, loss_rise as it was REACTION steps before), up to the run's last step: the negative control. Its
    crossing at a spike's onset comes REACTION steps later, inside that spike's reaction span (a reaction); an alarm
    of it in a warning window knows the loss only up to the step before the window's first possible step. `rise`:
    loss_rise(run), where it is at hand."""
    steps, values = rise if rise is not None else loss_rise(run)
    keep = [i for i, s in enumerate(steps) if s + REACTION <= run.steps[-1]]
    return tuple(steps[i] + REACTION for i in keep), tuple(values[i] for i in keep)


def _kind(signal: str) -> Signal:
    return STUDIED.get(signal) or CHECKS[signal]


def alarm_matrix(run: RunSteps, signal: str, thresholds) -> np.ndarray:
    """[thresholds, run.steps] booleans: where `signal` crosses each threshold (utils.telemetry.Alarm.crossed: from
    the other side at its previous value), from the end of the warm-up on."""
    thresholds = np.atleast_1d(np.asarray(thresholds, dtype=float))
    out = np.zeros((thresholds.size, len(run.steps)), bool)
    steps, values = run.signals.get(signal, ((), ()))
    if run.first_armed is None or not len(steps):
        return out
    s, v = np.asarray(steps, dtype=np.int64), np.asarray(values, dtype=float)
    prev = np.concatenate([[math.nan], v[:-1]])
    t = thresholds[:, None]
    fired = ((v >= t) & ~(prev >= t)) if _kind(signal).rises else ((v <= t) & ~(prev <= t))
    pos = np.searchsorted(run.step_array, s)
    ok = (s >= run.first_armed) & (pos < run.step_array.size)
    ok[ok] &= run.step_array[pos[ok]] == s[ok]
    out[:, pos[ok]] = fired[:, ok]
    return out


def alarms(run: RunSteps, signal: str, threshold: float) -> list[int]:
    """The steps at which `signal` crosses `threshold`, from the end of the warm-up on."""
    return run.step_array[alarm_matrix(run, signal, threshold)[0]].tolist()


def hits_of(alarm_steps: np.ndarray, run: RunSteps) -> np.ndarray:
    """Per spike of `run`: the first of the (sorted) alarm steps in its warning window, or -1 (no hit; always for a
    spike with an empty window). The alarms may be another run's: the window is the spike's."""
    lo, hi = run.windows[:, 0], run.windows[:, 1]
    if not alarm_steps.size:
        return np.full(lo.size, -1, dtype=np.int64)
    i = np.searchsorted(alarm_steps, lo)
    inside = i < alarm_steps.size
    inside[inside] &= alarm_steps[i[inside]] < hi[inside]
    return np.where(inside, alarm_steps[np.minimum(i, alarm_steps.size - 1)], -1)


@dataclass(frozen=True)
class Score:
    """What one threshold does on some runs: counts, summed."""

    spikes: int = 0  # spikes with a warning window
    hits: int = 0
    false_alarms: int = 0
    alarms: int = 0  # alarms at judged steps (true and false)
    judged_steps: int = 0
    leads: tuple = ()

    def __add__(self, o: "Score") -> "Score":
        return Score(self.spikes + o.spikes, self.hits + o.hits, self.false_alarms + o.false_alarms,
                     self.alarms + o.alarms, self.judged_steps + o.judged_steps, self.leads + o.leads)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.spikes if self.spikes else math.nan

    @property
    def false_per_1000(self) -> float:
        return 1000 * self.false_alarms / self.judged_steps if self.judged_steps else math.nan


def score(run: RunSteps, signal: str, threshold: float) -> Score:
    """Hits, lead times and false alarms of one threshold on one run (the module docstring's definitions)."""
    return score_fired(run, alarm_matrix(run, signal, threshold)[0])


def score_fired(run: RunSteps, fired: np.ndarray) -> Score:
    """`score` of the alarms `fired` (a boolean at each of run.steps)."""
    first = hits_of(run.step_array[fired], run)
    counted = fired & run.judged_mask
    return Score(int(run.warnable.sum()), int((first >= 0).sum()), int((counted & ~run.warned_mask).sum()),
                 int(counted.sum()), int(run.judged_mask.sum()), tuple((run.onsets - first)[first >= 0].tolist()))


def total(runs: list[RunSteps], signal: str, threshold: float) -> Score:
    return sum((score(r, signal, threshold) for r in runs), Score())
