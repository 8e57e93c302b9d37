"""Whether a per-step signal warns before loss spikes (the spike-warning study). No torch. The spike rule, one run's
record, alarms, hits and false alarms are research/analysis/spike_rule.py.

Thresholds are chosen on the calibration seeds (the first half) and evaluated only on the others. A signal WARNS
when its hits beat two nulls, runs paired within a learning rate (`permutation_test`) and each run's alarms
shifted in time (`shift_test`), at ALPHA / 2 / k; DOES NOT WARN when its excess over chance is shown below
MIN_EXCESS; else INCONCLUSIVE, or NO_THRESHOLD. LOSS_RISE and LATE_LOSS_RISE (a negative control) are tested
beside the signals, outside the family.
Why two nulls and these constants: docs/decisions.md, "Do the keys warn before the loss spikes?", and docs/spikes.md;
the error rates: research/simulations/spikes.py.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from research.analysis.rules import ALPHA
from research.analysis.wording import sides_digits
from research.analysis.spike_rule import (CHECKS, HORIZON, LATE_LOSS_RISE, LOSS_RISE, RunSteps, Score, alarm_matrix,
                                          hits_of, late_loss_rise, loss_rise, score_fired, total)
from research.analysis.stats import binomial_upper, mean_ci
from research.results.values import as_float
from research.results.vocabulary import LR_CONDITIONS
from utils.telemetry import STUDIED

# ---------------------------------------------------------------------------------- the evaluation
FALSE_ALARM_BOUND = 20.0  # false alarms per 1,000 steps a calibrated threshold may give on the calibration seeds
MIN_EXCESS = 0.25  # a hit rate less than this above chance is no useful warning: "does not warn"
MIN_SPIKES = 4  # held-out spikes any verdict needs
EXACT_UP_TO = 8  # runs at one rate whose permutations are all enumerated (8! = 40,320); above, MONTE_CARLO (seeded)
MONTE_CARLO = 20_000
WARNS, NO_WARNING, INCONCLUSIVE, NO_THRESHOLD = "warns", "does not warn", "inconclusive", "no usable threshold"
NOT_RECORDED = "not recorded in its runs"  # why a signal no run of its condition logged is inconclusive
ALIGN = (-2 * HORIZON, HORIZON)  # steps around the onset the figures show


# ---------------------------------------------------------------------------------- calibration
def candidates(runs: list[RunSteps], signal: str) -> np.ndarray:
    """The thresholds tried: 99 quantiles of the signal's values over the runs."""
    values = np.array([v for r in runs for v in r.signals.get(signal, ((), ()))[1]], dtype=float)
    values = values[np.isfinite(values)]
    return np.unique(np.quantile(values, np.linspace(0.01, 0.99, 99))) if values.size else np.array([])


def calibrate(runs: list[RunSteps], signal: str) -> tuple[float | None, Score | None]:
    """(threshold, its score on `runs`): the highest hit rate with false alarms under FALSE_ALARM_BOUND per 1,000
    steps, fewest false alarms among ties (then the lowest threshold); (None, None) when there is no spike or no
    threshold stays under it."""
    spikes = sum(int(r.warnable.sum()) for r in runs)
    tried = candidates(runs, signal)
    if not spikes or not tried.size:
        return None, None
    hits, false, judged = np.zeros(tried.size), np.zeros(tried.size), 0
    for r in runs:
        fired = alarm_matrix(r, signal, tried)
        if r.onsets.size:
            s = r.step_array[None, :]
            windows = (s >= r.windows[:, :1]) & (s < r.windows[:, 1:])  # [spikes, steps]: each warning window
            hits += (fired[:, None, :] & windows[None]).any(axis=2).sum(axis=1)
        false += (fired & r.judged_mask & ~r.warned_mask).sum(axis=1)
        judged += int(r.judged_mask.sum())
    if not judged:
        return None, None
    rate, fa = hits / spikes, 1000 * false / judged
    ok = np.flatnonzero(fa <= FALSE_ALARM_BOUND)
    if not ok.size:
        return None, None
    best = ok[np.lexsort((ok, fa[ok], -rate[ok]))[0]]  # highest hit rate, then fewest false alarms, then lowest
    t = float(tried[best])
    return t, total(runs, signal, t)


# ---------------------------------------------------------------------------------- the two nulls
@dataclass(frozen=True)
class Null:
    """The held-out hits against the hits of the same alarms and spikes rearranged under one null."""

    observed: int  # hits of each run's own alarms on its own spikes
    expected: float  # their mean under the null: chance
    p: float  # one-sided: the null's probability of at least the observed hits
    min_p: float  # the smallest p these runs can give (the null's probability of the most hits it reaches); with
    #   Monte Carlo pairings only the resolution, 1 / (MONTE_CARLO + 1), below every level a verdict uses
    exact: bool  # every arrangement counted (else MONTE_CARLO random pairings, seeded)


@functools.lru_cache(maxsize=None)
def _permutations(n: int) -> np.ndarray:
    return np.array(list(itertools.permutations(range(n))), dtype=np.int64).reshape(-1, n)


def _tail(counts: np.ndarray, observed: int) -> tuple[float, float]:
    """(p, min_p) of a distribution given as counts (or probabilities) per number of hits."""
    top = np.flatnonzero(counts)[-1]
    return min(1.0, float(counts[observed:].sum() / counts.sum())), float(counts[top] / counts.sum())


def permutation_test(groups: list[np.ndarray]) -> Null:
    """The null that keeps time. groups: per learning rate, H[i, j] = the spikes of run j hit by the alarms of run i.
    Under the null every permutation of the alarm sequences over the runs of a rate is as likely as the one
    observed; the hits of a pairing are sum_j H[pi(j), j]. Exact (each rate's permutations enumerated, their sums'
    distributions convolved over the rates) with at most EXACT_UP_TO runs at every rate, else MONTE_CARLO random
    pairings counted with the observed one."""
    groups = [np.asarray(h, dtype=np.int64) for h in groups if np.asarray(h).size]
    observed = int(sum(np.trace(h) for h in groups))
    expected = float(sum(h.sum() / len(h) for h in groups))  # each column's mean over the rows
    if all(len(h) <= EXACT_UP_TO for h in groups):
        counts = np.ones(1)  # pairings per number of hits (float: 8!^5 overflows int64; ratios stay exact enough)
        for h in groups:
            n = len(h)
            counts = np.convolve(counts, np.bincount(h[_permutations(n), np.arange(n)].sum(axis=1)).astype(float))
        return Null(observed, expected, *_tail(counts, observed), True)
    rng = np.random.default_rng(0)
    totals = np.zeros(MONTE_CARLO, dtype=np.int64)
    for h in groups:
        n = len(h)
        perms = rng.permuted(np.tile(np.arange(n), (MONTE_CARLO, 1)), axis=1)
        totals += h[perms, np.arange(n)].sum(axis=1)
    return Null(observed, expected, float((1 + (totals >= observed).sum()) / (MONTE_CARLO + 1)),
                1 / (MONTE_CARLO + 1), False)


def cross_hits(runs: list[RunSteps], alarm_steps: list[np.ndarray]) -> np.ndarray:
    """H[i, j]: the spikes of runs[j] hit by the alarms of runs[i]."""
    return np.array([[int((hits_of(a, r) >= 0).sum()) for r in runs] for a in alarm_steps],
                    dtype=np.int64).reshape(len(runs), len(runs))


def shift_hits(run: RunSteps, alarm_steps: np.ndarray) -> np.ndarray:
    """The spikes of `run` its own alarms hit when every one is moved d steps later, circularly over the run's armed
    steps: for d = 0 (as observed) and each d that leaves every alarm more than HORIZON steps (circularly) from its
    place (a smaller shift keeps a warning where it warns)."""
    own = np.array([int((hits_of(alarm_steps, run) >= 0).sum())])
    if run.first_armed is None or not alarm_steps.size or not run.warnable.any():
        return own
    first = run.first_armed
    n = int(run.steps[-1]) - first + 1
    d = np.arange(HORIZON + 1, n - HORIZON, dtype=np.int64)
    moved = first + (alarm_steps[None, :] - first + d[:, None]) % n  # [shifts, alarms]
    lo, hi = run.windows[run.warnable].T
    inside = (moved[:, :, None] >= lo) & (moved[:, :, None] < hi)  # [shifts, alarms, spikes]
    return np.concatenate([own, inside.any(axis=1).sum(axis=1)])


def shift_test(runs: list[RunSteps], alarm_steps: list[np.ndarray]) -> Null:
    """The null that keeps each run: its alarms carry no timing of its own spikes, so moving them in time (each shift
    of `shift_hits` equally likely, each run on its own) gives hits like the observed. It keeps what differs between
    runs (how many alarms, how many spikes), not when in training things happen. Exact: each run's distribution over
    its shifts, convolved over the runs."""
    observed, expected, dist = 0, 0.0, np.ones(1)
    for r, a in zip(runs, alarm_steps):
        h = shift_hits(r, a)
        observed, expected = observed + int(h[0]), expected + float(h.mean())
        dist = np.convolve(dist, np.bincount(h) / h.size)
    return Null(observed, expected, *_tail(dist, observed), True)


def spikes_to_rule_out(k: int, chance: float = 0.0) -> int:
    """The fewest held-out spikes whose exact upper bound on the hit rate, with no hit, lies below chance + MIN_EXCESS
    at the one-sided level ALPHA / 2 / k: 1 - (ALPHA / 2 / k) ** (1 / n) < chance + MIN_EXCESS. 'Does not warn'
    needs at least this many (20 at 7 signals where chance is 0; fewer where chance is higher)."""
    room = 1 - MIN_EXCESS - chance
    if room <= 0:
        return 1
    return math.floor(math.log(ALPHA / 2 / k) / math.log(room)) + 1


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
    chance: Interval | None  # per seed: the hits the runs-paired null expects, as a share of its spikes
    excess: Interval | None  # hit rate - chance, per seed
    verdict: str
    text: str  # the verdict and why, with what its report's table row lacks: hits, hits expected, the excess
    permutation: Null | None = None  # runs paired within a rate
    excess_bound: float = math.nan  # the exact upper bound on the pooled hit rate minus the pooled chance
    quiet_false_alarms: float = math.nan  # alarms per 1,000 judged steps in held-out runs without a spike
    shifts: Null | None = None  # each run's alarms shifted in time against its own spikes

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
    summary: dict  # condition -> the sentence on the whole condition
    checks: dict  # (LOSS_RISE or LATE_LOSS_RISE, condition) -> SignalResult
    family: dict  # condition -> the signals tested, k of the Bonferroni level (0: none; the checks never count)

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


def near_bound(x: float, decimals: int = 2) -> str:
    """An excess over chance, or a bound on it, with the decimals that keep it on its side of 0 and of MIN_EXCESS
    (wording.sides_digits: a t bound of 0.2496 is below 0.25, never '0.25')."""
    return f"{x:.{sides_digits([x], [0.0, MIN_EXCESS], decimals)}f}" if math.isfinite(x) else "n/a"


def ci_text(i: Interval | None, f: str = ".2f", near: bool = False) -> str:
    """'0.40 [0.10, 0.70]'; `near`: an excess over chance, its ends printed on their side of 0 and MIN_EXCESS."""
    if i is None or not math.isfinite(i.mean):
        return "n/a"
    if not math.isfinite(i.lo):
        return f"{i.mean:{f}} (one seed)"
    if near:
        n = sides_digits([i.lo, i.hi], [0.0, MIN_EXCESS], 2)
        return f"{i.mean:.{n}f} [{i.lo:.{n}f}, {i.hi:.{n}f}]"
    return f"{i.mean:{f}} [{i.lo:{f}}, {i.hi:{f}}]"


def p_text(p: float) -> str:
    return "n/a" if not math.isfinite(p) else f"{p:.2g}" if p >= 1e-4 else f"{p:.1e}"


@dataclass(frozen=True)
class Evaluation:
    """One threshold on the held-out runs of a condition."""

    per_seed: dict  # seed -> Score (each run's own alarms on its own spikes)
    chance: dict  # seed -> the hits the runs-paired null expects on its spikes
    permutation: Null  # runs paired within a rate
    shifts: Null  # each run's alarms shifted in time
    quiet: Score  # the held-out runs without a spike, pooled


def evaluate(runs: list[RunSteps], signal: str, threshold: float, seeds: list) -> Evaluation:
    """Score the held-out `runs` at `threshold`; set each run's alarms against the spikes of the others at its
    learning rate (the null that keeps time) and against its own spikes shifted in time (the null that keeps runs)."""
    at_step = {id(r): alarm_matrix(r, signal, threshold)[0] for r in runs}
    fired = {id(r): r.step_array[at_step[id(r)]] for r in runs}  # ascending, as the steps
    expected: dict = {}
    groups = []
    for m in sorted({r.multiplier for r in runs}):
        at = [r for r in runs if r.multiplier == m]
        h = cross_hits(at, [fired[id(r)] for r in at])
        groups.append(h)
        for j, r in enumerate(at):
            expected[r.seed] = expected.get(r.seed, 0.0) + float(h[:, j].mean())

    def pooled(of: list[RunSteps]) -> Score:
        return sum((score_fired(r, at_step[id(r)]) for r in of), Score())
    per_seed = {s: pooled([r for r in runs if r.seed == s]) for s in seeds}
    return Evaluation(per_seed, {s: expected.get(s, 0.0) for s in seeds}, permutation_test(groups),
                      shift_test(runs, [fired[id(r)] for r in runs]), pooled([r for r in runs if not r.spikes]))


def _decide(signal: str, cond: str, threshold, cal: Score | None, ev: Evaluation | None, n_spikes: dict,
            level: float, k: int, eval_seeds: list) -> SignalResult:
    """The verdict on one signal (or check) of one condition; `n_spikes`: held-out spikes per evaluation seed."""
    alpha = (1 - level) / 2  # one-sided, per signal: ALPHA / 2 / k
    seeds_with = sum(1 for s in eval_seeds if n_spikes.get(s))
    spikes = sum(n_spikes.get(s, 0) for s in eval_seeds)
    per_seed = ev.per_seed if ev else {s: Score(spikes=n_spikes.get(s, 0)) for s in eval_seeds}
    scores = list(per_seed.values()) if ev else []
    hit = Interval.of([s.hit_rate for s in scores], level, 0, 1)
    fa = Interval.of([s.false_per_1000 for s in scores], level, 0)
    lead = Interval.of([float(np.mean(s.leads)) if s.leads else math.nan for s in scores], level, 1, HORIZON)
    chance = Interval.of([ev.chance[s] / p.spikes for s, p in per_seed.items() if p.spikes] if ev else [], level, 0, 1)
    excess = Interval.of([p.hit_rate - ev.chance[s] / p.spikes for s, p in per_seed.items() if p.spikes]
                         if ev else [], level, -1, 1)
    perm, shifts = (ev.permutation, ev.shifts) if ev else (None, None)
    bound = (binomial_upper(perm.observed, spikes, alpha) - perm.expected / spikes) if perm and spikes else math.nan
    quiet = ev.quiet.false_per_1000 if ev else math.nan
    named = f"{signal} at threshold {threshold:.4g}" if threshold is not None else signal
    need = spikes_to_rule_out(k, perm.expected / spikes) if perm and spikes else spikes_to_rule_out(k)
    nulls = (("with the runs paired", perm), ("with each run's alarms shifted in time", shifts)) if ev else ()
    if not eval_seeds:
        verdict, why = INCONCLUSIVE, "no seed to evaluate on: the study needs 2 seeds or more"
    elif spikes < MIN_SPIKES or seeds_with < 2:
        verdict, why = INCONCLUSIVE, (f"{spikes} held-out spike(s) on {seeds_with} seed(s); a verdict needs "
                                      f"{MIN_SPIKES} on 2 seeds or more")
    elif threshold is None:
        verdict, why = NO_THRESHOLD, (f"no threshold kept its false alarms under {FALSE_ALARM_BOUND:g} per 1,000 steps "
                                      f"on the calibration seeds")
    elif perm.p <= alpha and shifts.p <= alpha:
        verdict, why = WARNS, (f"p {p_text(perm.p)} with the runs paired and {p_text(shifts.p)} with each run's "
                               f"alarms shifted in time, both \u2264 {p_text(alpha)}")
    elif excess.hi < MIN_EXCESS and bound < MIN_EXCESS:
        verdict, why = NO_WARNING, (f"its hit rate is shown less than {MIN_EXCESS:g} above chance by the t bound "
                                    f"over seeds ({near_bound(excess.hi)}) and the exact bound on the pooled "
                                    f"hits ({near_bound(bound)})")
    else:
        open_ = [f"p {p_text(n.p)} {how} > {p_text(alpha)}" for how, n in nulls if n.p > alpha]
        open_ += [f"no arrangement {how} could give p \u2264 {p_text(alpha)} (the smallest is {p_text(n.min_p)}): a "
                  f"warning needs more held-out runs" for how, n in nulls if n.min_p > alpha]
        reach = [f"{name} {near_bound(v)}" for name, v in (("t bound over seeds", excess.hi), ("exact bound", bound))
                 if not v < MIN_EXCESS]
        open_.append(f"a hit rate {MIN_EXCESS:g} above chance is not ruled out ({', '.join(reach)})")
        if spikes < need:
            open_.append(f"ruling it out needs {need} held-out spikes even with no hit, {spikes} here")
        verdict, why = INCONCLUSIVE, "; ".join(open_)
    text = f"{named} in {cond}: {verdict} ({why})"
    if ev is not None:  # the hit rate, chance, false alarms and lead are its table row's: here what the row lacks
        text += (f"; {perm.observed} of {spikes} held-out spikes hit, {perm.expected:.1f} expected with the runs "
                 f"paired and {shifts.expected:.1f} shifted; excess over chance {ci_text(excess, near=True)}, exact "
                 f"bound {near_bound(bound)}")
    text += "."
    return SignalResult(signal, cond, threshold, cal, per_seed, hit, fa, lead, chance, excess, verdict, text, perm,
                        bound, quiet, shifts)


def aligned(runs: list[RunSteps], name: str) -> np.ndarray:
    """[n_spikes, offsets]: the signal (or "loss") at ALIGN[0]..ALIGN[1] steps from each onset (NaN where none)."""
    offsets = np.arange(ALIGN[0], ALIGN[1] + 1)
    out = []
    for r in runs:
        steps, values = (r.steps, r.loss) if name == "loss" else r.signals.get(name, ((), ()))
        at = dict(zip(steps, values))
        for s in r.spikes:
            out.append([as_float(at.get(s.onset + o)) for o in offsets])
    return np.array(out, dtype=float).reshape(len(out), offsets.size)


def _with_checks(runs: list[RunSteps]) -> list[RunSteps]:
    """The runs with the two checks' series beside their signals."""
    out = []
    for r in runs:
        rise = loss_rise(r)
        out.append(dataclasses.replace(r, signals={**r.signals, LOSS_RISE: rise,
                                                   LATE_LOSS_RISE: late_loss_rise(r, rise)}))
    return out


def analyze(runs: list[RunSteps], seeds: list | None = None) -> SpikeAnalysis:
    """Calibrate on the first half of `seeds` (default: the runs' seeds, sorted), evaluate on the rest, per signal
    and condition; the checks beside them."""
    seeds = list(seeds) if seeds else sorted({r.seed for r in runs if r.seed is not None})
    cal_seeds, eval_seeds = split_seeds(seeds) if len(seeds) > 1 else (seeds, [])
    present = {r.condition for r in runs}
    conditions = [c for c in LR_CONDITIONS if c in present] + sorted(present - set(LR_CONDITIONS))
    results, checks, levels, summary, al, family = {}, {}, {}, {}, {}, {}
    for cond in conditions:
        raw = [r for r in runs if r.condition == cond]
        of = _with_checks(raw)
        cal_runs = [r for r in of if r.seed in cal_seeds]
        held = [r for r in of if r.seed in eval_seeds]
        n_spikes = {s: sum(int(r.warnable.sum()) for r in held if r.seed == s) for s in eval_seeds}
        chosen = {sig: calibrate(cal_runs, sig) for sig in (*STUDIED, *CHECKS)}
        evals = {sig: evaluate(held, sig, t, eval_seeds) if t is not None and eval_seeds else None
                 for sig, (t, _) in chosen.items()}
        tested = sum(1 for sig in STUDIED if evals[sig] is not None and sum(1 for n in n_spikes.values() if n) >= 2)
        family[cond], k = tested, max(tested, 1)
        levels[cond] = 1 - ALPHA / k
        cal_spikes = sum(int(r.warnable.sum()) for r in cal_runs)
        for sig, (t, cal) in chosen.items():
            res = _decide(sig, cond, t, cal, evals[sig], n_spikes, levels[cond], k, eval_seeds)
            if not candidates(of, sig).size:
                res = _undecided(res, NOT_RECORDED)
            elif t is None and not cal_spikes:
                res = _undecided(res, f"no spike in {cond}'s calibration seeds ({', '.join(map(str, cal_seeds))}), "
                                      f"so no threshold was chosen")
            (results if sig in STUDIED else checks)[(sig, cond)] = res
        summary[cond] = _summary(cond, [results[(sig, cond)] for sig in STUDIED])
        for name in ("loss", *STUDIED):
            al[(name, cond)] = aligned(raw, name)
    return SpikeAnalysis(tuple(runs), conditions, cal_seeds, eval_seeds, results, al, levels, summary, checks,
                         family)


def _summary(cond: str, results: list[SignalResult]) -> str:
    """The condition in one sentence: the signals that warn; else "no signal warns" only when every signal was
    decided not to, and "no signal was shown to warn" otherwise; then the other outcomes by name."""
    by = {v: [r.signal for r in results if r.verdict == v] for v in (WARNS, NO_WARNING, NO_THRESHOLD, INCONCLUSIVE)}
    if by[WARNS]:
        head = f"In {cond}, {', '.join(by[WARNS])} warn{'s' if len(by[WARNS]) == 1 else ''}"
    elif len(by[NO_WARNING]) == len(results):
        head = f"In {cond}, no signal warns"
    else:
        head = f"In {cond}, no signal was shown to warn"
    rest = [f"{v}: {', '.join(by[v])}" for v in (NO_WARNING, NO_THRESHOLD, INCONCLUSIVE)
            if by[v] and not (v == NO_WARNING and len(by[v]) == len(results))]
    return head + (f"; {'; '.join(rest)}." if rest else ".")


def _undecided(res: SignalResult, why: str) -> SignalResult:
    """A signal that could not be calibrated: inconclusive, and why."""
    return dataclasses.replace(res, verdict=INCONCLUSIVE, text=f"{res.signal} in {res.condition}: {INCONCLUSIVE} "
                               f"({why}).")
