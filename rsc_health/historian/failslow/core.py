"""The pure core of fail-slow detection: each node of a multi-node job against the job's other
nodes, sweep slot by sweep slot, persisting (docs/failslow.md).

    observations  one value per (job, node, peer group, metric, slot): telemetry samples joined
                  to the jobs the node ran at their time; step times per node and stage
    judge         per (job, group, metric, slot): the peers' median and robust spread give the
                  line (the qualification judge's tolerance, rsc_health/qualify/judge.py, or
                  the metric's min_delta when larger); past it in the bad direction: outlier
    job-wide      more than max_outlier_share of a slot's nodes (and more than one) outlying is
                  the workload's or the fabric's shift: that slot flags no node
    persist       persist_sweeps outlying slots in a row (a missing slot breaks the run)
    suspects      nodes already suspect (their onset was seen by an earlier window): judged
                  against their peers, never against their own level or start in this window

No I/O and no clock: `detect_frame(samples, membership, steps, cfg, suspects)`; `load.detect`
reads the historian and calls it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from rsc_health.historian.failslow.evidence import STEPS, TELEMETRY, SuspectEvidence
from rsc_health.model import RANGES
from rsc_health.qualify.judge import tolerances

LOW, HIGH = "low", "high"
DIRECTIONS = (LOW, HIGH)
SAMPLE_COLUMNS = ("node", "time", "metric", "value", "component")
# A sample column (shared_samples): its node ran a job membership does not hold as well.
SHARED = "shared"
MEMBER_COLUMNS = ("job_id", "node", "start", "end")
STEP_COLUMNS = ("job_id", "rank", "node", "stage", "step", "seconds", "time")
MAD_SCALE = 1.4826
# A slot this many lines past (deviation >= STRONG x k) is the whole node's, whatever its worst
# component: a run of such slots persists even as the worst GPU or slowest rank changes.
STRONG = 2.0
# A node's start in a job: the first this many judged slots (the less off of them: an onset in
# the second slot still leaves a level start).
STEADY_SLOTS = 2
# Metrics whose run short of STRONG needs a word from another metric before persist_sweeps
# suffice, else one sweep more, and metrics judged against each node's own level in the job:
# the [failslow.metrics.NAME] keys `corroborated_by` and `levelled` (MetricRule; their
# defaults and reasons in default_config.toml). A node's level is its share of its peers'
# median over its first LEVEL_SLOTS judged slots (the median of them: one checkpoint among
# them does not move it), and only the lighter side of 1 (a node busier than its peers is
# judged as one at the median). A node at its level from its first slots (no onset, e.g. links
# down before the job) is still judged against its peers when STRONG lines past them.
LEVEL_SLOTS = 3
# How far back `_moved_with` looks for when a node's displacement began (slots): one displaced
# this long is in a state of its own, whatever began before the window.
HELD_SLOTS = 12
_NO_GROUP = ""
# The log-chance of an excursion larger than any the fleet showed (exp() of it, and of any sum
# of such, is 0).
NO_CHANCE = -1e4


@dataclass(frozen=True)
class MetricRule:
    direction: str  # LOW | HIGH: which way is bad
    min_delta: float  # smallest deviation that counts, in the metric's unit
    max_margin: float  # the metric's cap on the relative tolerance (0: the section's)
    persist: int = 0  # the metric's own persist_sweeps (0: the section's)
    min_margin: float = 0.0  # the metric's floor on the relative tolerance (0: the section's)
    # A run is of one component only: no STRONG exception (a count whose peers count none is
    # "many lines past" at its first error, so bursts on two ports would make one run).
    same_component: bool = False
    # The value is a count per second over the sweep's interval (errors): a run goes on only
    # while the count does not fall to under half the run's previous slot by more than chance
    # (3 Poisson sigmas). A port going bad does not back off by half the next sweep; two
    # healthy bursts of independent size on one port often do.
    counts: bool = False
    # Metrics whose sample vouches for a run of this one short of STRONG (docs/failslow.md):
    # the same node and slot, the same component (the step-time metric, whose component is a
    # rank: the same node), at least half a line on its bad side. Without one in the run's
    # slots the run waits one sweep more. Empty: persist_sweeps suffice.
    corroborated_by: tuple[str, ...] = ()
    # Judged over each node's own level in the job (its role), not its peers' raw median.
    levelled: bool = False
    # A run short of persist_sweeps + 1 slots is confirmed only when it is rare by the fleet's
    # own rate (`_chance`): healthy nodes' one-sweep excursions of this metric in the window,
    # as large and (same_component) on the same component, would make one like it less often
    # than [failslow] fleet_chance_per_node_day. Otherwise it waits one sweep more.
    fleet_chance: bool = False

    @property
    def sign(self) -> float:
        return -1.0 if self.direction == LOW else 1.0


@dataclass(frozen=True)
class Rules:
    k: float
    min_margin: float
    max_margin: float
    slot_s: int
    persist_sweeps: int
    min_nodes: int
    max_outlier_share: float
    steps_metric: str
    metrics: Mapping[str, MetricRule]
    fleet_chance_per_node_day: float = 0.0
    # A telemetry slot is judged once every node of its job delivered a sample at or after it,
    # or once it ended this many seconds ago (`delivered`); 0: as soon as it holds samples.
    complete_s: int = 2400
    # A pass's window (lookback_min): a node's delivery mark is its newest sample within it,
    # whatever window the caller read (`suspects job` reads the job's span: a member silent
    # for hours had an old mark there and held back slots the pass judged, helper-111).
    lookback_s: int = 3600

    @classmethod
    def from_config(cls, cfg: Any) -> Rules:
        """[failslow] of a Config (or anything with `.get(dotted)`)."""
        metrics = {}
        for name, table in (cfg.get("failslow.metrics") or {}).items():
            direction = str(table.get("direction"))
            if direction not in DIRECTIONS:
                raise ValueError(f"[failslow.metrics.{name}] direction {direction!r}: "
                                 f"must be one of {', '.join(DIRECTIONS)}")
            metrics[str(name)] = MetricRule(direction, float(table.get("min_delta") or 0.0),
                                            float(table.get("max_margin") or 0.0),
                                            int(table.get("persist_sweeps") or 0),
                                            float(table.get("min_margin") or 0.0),
                                            bool(table.get("same_component") or False),
                                            bool(table.get("counts") or False),
                                            tuple(str(m) for m in
                                                  table.get("corroborated_by") or ()),
                                            bool(table.get("levelled") or False),
                                            bool(table.get("fleet_chance") or False))
        return cls(
            k=float(cfg.get("failslow.k")),
            min_margin=float(cfg.get("failslow.min_margin")),
            max_margin=float(cfg.get("failslow.max_margin")),
            slot_s=max(1, int(cfg.get("failslow.slot_s"))),
            persist_sweeps=max(1, int(cfg.get("failslow.persist_sweeps"))),
            min_nodes=max(2, int(cfg.get("failslow.min_nodes"))),
            max_outlier_share=float(cfg.get("failslow.max_outlier_share")),
            steps_metric=str(cfg.get("failslow.steps_metric")),
            metrics=metrics,
            fleet_chance_per_node_day=float(cfg.get("failslow.fleet_chance_per_node_day")
                                            or 0.0),
            complete_s=max(0, int(cfg.get("failslow.complete_after_s") or 0)),
            lookback_s=int(float(cfg.get("failslow.lookback_min")) * 60),
        )


def utc(times: pd.Series) -> pd.Series:
    """Times as naive UTC (the historian's form): an aware time is converted, a naive one is
    taken as UTC, so samples, jobs and step times from different sources compare."""
    times = pd.Series(times)
    if pd.api.types.is_datetime64_dtype(times.dtype):  # already naive: no copy, no parse
        return times if times.dtype == "datetime64[ns]" else times.astype("datetime64[ns]")
    return pd.to_datetime(times, utc=True).dt.tz_localize(None).astype("datetime64[ns]")


def _slot(times: pd.Series, slot_s: int) -> pd.Series:
    return utc(times).astype("int64") // (slot_s * 10**9)


def _group_key(frame: pd.DataFrame, min_nodes: int = 1) -> pd.Series:
    """Each (job, node)'s telemetry peer group: its GPU model and pipeline stage.

    A node whose model is not known (never qualified) takes its job's most common known
    model: the likeliest, and a node left in a group of its own is never judged. The stage
    comes from the job's own step files, untrusted: a job any of whose stages has fewer than
    `min_nodes` nodes of a model is judged whole, stages pooled (8 stages of 2 nodes each
    would leave every node unjudged, and a file naming one node a stage of its own would
    hide it from its peers)."""
    idx = frame.index
    model = pd.Series(frame["gpu_model"] if "gpu_model" in frame else _NO_GROUP,
                      index=idx).fillna(_NO_GROUP).astype(str)
    stage = pd.Series(frame["stage"] if "stage" in frame else _NO_GROUP,
                      index=idx).fillna(_NO_GROUP).astype(str)
    if "job_id" not in frame or frame.empty:
        return model + "|" + stage
    job = frame["job_id"]
    if (model == _NO_GROUP).any() and (model != _NO_GROUP).any():
        known = pd.DataFrame({"job_id": job, "model": model})[model != _NO_GROUP]
        likeliest = known.groupby("job_id")["model"].agg(lambda m: m.value_counts().index[0])
        model = model.where(model != _NO_GROUP, job.map(likeliest).fillna(_NO_GROUP))
    if (stage != _NO_GROUP).any():
        size = pd.DataFrame({"job_id": job, "model": model, "stage": stage}).groupby(
            ["job_id", "model", "stage"])["stage"].transform("size")
        small = pd.Series(size.to_numpy() < min_nodes, index=idx).groupby(job).transform("any")
        stage = stage.where(~small, _NO_GROUP)
    return model + "|" + stage


def telemetry_observations(samples: pd.DataFrame, membership: pd.DataFrame,
                           rules: Rules) -> pd.DataFrame:
    """Samples of judged metrics joined to the jobs their node ran at their time: one row per
    (job, node, group, metric, slot), its value the median of the slot's samples."""
    cols = ["job_id", "node", "group", "metric", "slot", "time", "value", "component", "source"]
    if samples is None or samples.empty or membership is None or membership.empty:
        return pd.DataFrame(columns=cols)
    judged_metric = samples["metric"].isin(list(rules.metrics))
    if SHARED in samples:
        # the node ran a job membership does not hold as well (shared_samples)
        judged_metric &= ~samples[SHARED].fillna(False).astype(bool)
    s = samples.loc[judged_metric, list(SAMPLE_COLUMNS)]
    s = s.assign(value=pd.to_numeric(s["value"], errors="coerce"),
                 time=utc(s["time"]))
    s = s[np.isfinite(s["value"].to_numpy(dtype=float)) & _in_range(s)]
    m = membership.assign(group=_group_key(membership, rules.min_nodes))[
        ["job_id", "node", "start", "end", "group"]]
    m = m.assign(start=utc(m["start"]), end=utc(m["end"]))
    j = s.merge(m, on="node", how="inner")
    inside = (j["time"] >= j["start"]) & (j["end"].isna() | (j["time"] < j["end"]))
    j = j[inside]
    # A node two judged jobs shared at the sample's time (OverSubscribe, GPUs split between
    # jobs) says one node-level figure, its worst GPU's, whoever's GPU that is: judged in
    # either job it blamed the other job's GPU. Such samples are judged in neither (and, by
    # shared_samples, those of a node a one-node job shared, which membership does not hold).
    shared = j.groupby(["node", "time", "metric"], sort=False)["job_id"].transform("nunique")
    j = j[shared.to_numpy() == 1]
    if j.empty:
        return pd.DataFrame(columns=cols)
    j = j.assign(slot=_slot(j["time"], rules.slot_s), component=j["component"].fillna(""))
    key = ["job_id", "node", "group", "metric", "slot"]
    out = (j.groupby(key, sort=False)
           .agg(time=("time", "max"), value=("value", "median"), n=("value", "size"),
                component=("component", "first"))
           .reset_index())
    many = (out["n"] > 1).to_numpy()
    if many.any():
        # a slot with several samples (a resent spool, an operator's check beside the sweep):
        # its latest sample names the component (ties: the greatest name), whatever order the
        # rows came in
        sub = j.merge(out.loc[many, key], on=key, how="inner").assign(
            component=lambda f: f["component"].astype(str))
        last = (sub.sort_values(["time", "component"], kind="stable")
                .drop_duplicates(key, keep="last").set_index(key)["component"])
        at = out.loc[many, key].set_index(key).index
        out.loc[many, "component"] = last.reindex(at).to_numpy()
    out = out.drop(columns="n")
    return out.assign(source=TELEMETRY)[cols]


def shared_samples(samples: pd.DataFrame | None, others: pd.DataFrame | None
                   ) -> pd.DataFrame | None:
    """`samples` with column SHARED: True where, at the sample's time, its node ran one of
    `others` (job_id, node, start, end: jobs membership does not hold, the one-node ones
    beside a multi-node job). The node-level figure is its worst GPU's, whoever's GPU that
    is, so such a sample is judged in no job (telemetry_observations), as one two judged jobs
    shared. The samples stay in the frame: a node's newest one still says how far its spool
    was delivered (`delivered`)."""
    if samples is None or samples.empty or others is None or others.empty:
        return samples
    o = others[["node", "start", "end"]].assign(node=others["node"].astype(str),
                                                start=utc(others["start"]),
                                                end=utc(others["end"]))
    s = pd.DataFrame({"row": np.arange(len(samples)),
                      "node": samples["node"].astype(str).to_numpy(),
                      "time": utc(samples["time"]).to_numpy()})
    j = s[s["node"].isin(set(o["node"]))].merge(o, on="node", how="inner")
    inside = (j["time"] >= j["start"]) & (j["end"].isna() | (j["time"] < j["end"]))
    shared = np.zeros(len(samples), dtype=bool)
    shared[j.loc[inside, "row"].to_numpy(dtype="int64")] = True
    return samples.assign(**{SHARED: shared})


def _in_range(s: pd.DataFrame) -> np.ndarray:
    """Rows whose value is a reading their metric can have (model.RANGES): the flush refuses
    the others, and rows stored before it did are not judged (a negative link ratio counted
    as a node that moved with its job)."""
    codes, names = pd.factorize(s["metric"])  # a dozen names: one lookup each, not a row's
    bounds = [RANGES.get(str(n), (-np.inf, None)) for n in names]
    lo = np.array([b[0] for b in bounds] or [0.0], dtype=float)[codes]
    hi = np.array([np.inf if b[1] is None else b[1] for b in bounds] or [0.0], dtype=float)[codes]
    value = s["value"].to_numpy(dtype=float)
    return (value >= lo) & (value <= hi)


def step_observations(steps: pd.DataFrame | None, membership: pd.DataFrame | None,
                      rules: Rules) -> pd.DataFrame:
    """Step times as one value per (job, node, stage, slot): for each step the node's slowest
    rank (a slow GPU slows its own rank; the historian keeps only that one, steps.py), then
    the median over the slot's steps."""
    cols = ["job_id", "node", "group", "metric", "slot", "time", "value", "component", "source"]
    if steps is None or steps.empty or rules.steps_metric not in rules.metrics:
        return pd.DataFrame(columns=cols)
    s = steps.assign(job_id=steps["job_id"].astype(str), node=steps["node"].astype(str),
                     seconds=pd.to_numeric(steps["seconds"], errors="coerce"),
                     time=utc(steps["time"]))
    s = s[np.isfinite(s["seconds"].to_numpy(dtype=float)) & (s["seconds"] > 0)]
    if s.empty:
        return pd.DataFrame(columns=cols)
    stage = s["stage"] if "stage" in s else pd.Series(_NO_GROUP, index=s.index)
    s = s.assign(stage=stage.fillna(_NO_GROUP).astype(str), slot=_slot(s["time"], rules.slot_s))
    # A job's file is the job's word, not Slurm's: only rows of nodes the job ran on (its
    # membership), inside the time it ran there, are judged. A hostile or mistaken file naming
    # other nodes makes none of them a suspect.
    if membership is None or membership.empty:
        return pd.DataFrame(columns=cols)
    m = membership.assign(start=utc(membership["start"]), end=utc(membership["end"]))
    model = m["gpu_model"] if "gpu_model" in m else pd.Series(_NO_GROUP, index=m.index)
    m = m.assign(gpu_model=model.fillna(_NO_GROUP).astype(str))[
        ["job_id", "node", "start", "end", "gpu_model"]]
    s = s.merge(m.astype({"job_id": str, "node": str}),
                on=["job_id", "node"], how="inner")
    s = s[(s["time"] >= s["start"]) & (s["end"].isna() | (s["time"] <= s["end"]))]
    # a requeued job's rows, a line read twice: the slowest of a rank's step, and ties to
    # the lowest rank, whatever order the rows came in
    s = s.sort_values(["seconds", "rank"], ascending=[False, True], kind="stable")
    s = s.drop_duplicates(["job_id", "node", "rank", "stage", "step"])
    if s.empty:
        return pd.DataFrame(columns=cols)
    s = s.assign(group=s["gpu_model"].fillna(_NO_GROUP).astype(str) + "|" + s["stage"])
    step_key = ["job_id", "node", "group", "slot", "step"]
    s = s.reset_index(drop=True)
    slowest = s.loc[s.groupby(step_key, sort=False)["seconds"].idxmax()]
    key = ["job_id", "node", "group", "slot"]
    out = (slowest.groupby(key, sort=False)
           .agg(time=("time", "max"), value=("seconds", "median")).reset_index())
    # the rank that was slowest most often in the slot names the component; among those as
    # often, the one whose steps were slowest, then the lowest (whatever order rows came in)
    counts = (slowest.groupby(key + ["rank"], sort=False)
              .agg(n=("seconds", "size"), most=("seconds", "median")).reset_index())
    best = counts.sort_values(["n", "most", "rank"], ascending=[False, False, True],
                              kind="stable").drop_duplicates(key)
    out = out.merge(best[key + ["rank"]], on=key, how="left")
    out = out.assign(metric=rules.steps_metric, source=STEPS,
                     component="rank " + out["rank"].astype(str))
    return out[cols]


def _per_metric(metric: pd.Series, rules: Rules, field: Callable[[MetricRule], object],
                default: object = np.nan, dtype: type = float) -> np.ndarray:
    """Each row's value of one of its metric's rules (`default` for a metric without a table)."""
    return metric.map({m: field(r) for m, r in rules.metrics.items()}).fillna(
        default).to_numpy(dtype=dtype)


def judge_slots(obs: pd.DataFrame, rules: Rules) -> pd.DataFrame:
    """Each observation against its (job, group, metric, slot) peers: median, line, outlier,
    deviation; groups under min_nodes nodes are dropped; job-wide slots flag no one."""
    if obs.empty:
        return obs.assign(median=[], line=[], deviation=[], outlier=[], n=[], job_wide=[],
                          overtaken=[])
    key = ["job_id", "group", "metric", "slot"]
    obs, rel = peers(obs, key, rules.min_nodes)
    if obs.empty:
        return obs.assign(line=[], deviation=[], outlier=[], job_wide=[], overtaken=[])
    # A handful of nodes give a spread that is often too small by luck: the group's typical
    # spread over its slots (the median of its per-slot spreads) is the least one slot gets.
    per_slot = rel.groupby([obs[c] for c in key], sort=False).first()
    typical = per_slot.groupby(level=[0, 1, 2], sort=False).median().rename("typical")
    rel = np.maximum(rel.to_numpy(), obs[["job_id", "group", "metric"]].join(
        typical, on=["job_id", "group", "metric"])["typical"].to_numpy())

    sign = _per_metric(obs["metric"], rules, lambda r: r.sign)
    min_delta = _per_metric(obs["metric"], rules, lambda r: r.min_delta)
    tol, line, bad, outlier = lines(obs, rel, rules)
    obs = obs.assign(line=line, deviation=_deviation(bad, line, rules.k), outlier=outlier)
    # Job-wide: counted over the job's whole metric and slot, every group together (a leaf
    # switch's nodes span stages), so a shift one group sees as a single node is still seen.
    # A node moved with it when its own deviation is at least half the outlier's: a leaf
    # switch's congested nodes all move, and widen the spread so only some pass the line.
    n_job = obs.groupby(["job_id", "metric", "slot"], sort=False)["value"].transform("size")
    allowed = np.maximum(1, np.floor(rules.max_outlier_share * n_job))
    # each row's group median in the slot before, and the line there (`_lagging`,
    # `_overtaken`: where the job was before this slot)
    prev = _median_before(obs)
    prev_line = np.maximum(tol * np.abs(prev), min_delta)
    lagging = _lagging(obs, prev, prev_line, sign)
    moved = _moved_with(obs, rules)
    job_wide = obs["outlier"] & ((moved > allowed) | lagging)
    # A node that was an outlier on its own in the slot before is in a state of its own: a
    # move of other nodes that began after that state was seen is another event, and does not
    # make its next slot the job's (a second pass, with the first pass's own outliers).
    # Telemetry only: a job's step times share one clock, and a phase of the workload that
    # reaches its ranks one after another is the job's, whichever rank it reached first.
    # Only a slot the first pass made the job's can change (the second counts fewer movers):
    # the nodes' histories read are those of such slots' (job, metric, node).
    may = (job_wide.to_numpy() & ~lagging & (obs["source"] == TELEMETRY).to_numpy())
    since = pd.Series(np.nan, index=obs.index)
    if may.any():
        nkey = ["job_id", "metric", "node"]
        mine = obs[nkey].merge(obs.loc[may, nkey].drop_duplicates().assign(_mine=True),
                               on=nkey, how="left")["_mine"].notna().to_numpy()
        part = obs[mine]
        since = _alone_since(part.assign(
            alone=part["outlier"] & ~job_wide[mine] & (part["source"] == TELEMETRY))
        ).reindex(obs.index).where(may)
    if since.notna().any():
        # the rows it reads: those slots of their job and metric, the slot either side and
        # the one before that (`_moved_later` reads a mover's slot before its move)
        key = ["job_id", "metric", "slot"]
        at = obs.loc[since.notna().to_numpy(), key]
        near = pd.concat([at.assign(slot=at["slot"] + d) for d in (-2, -1, 0, 1)]
                         ).drop_duplicates()
        again = obs[key].merge(near.assign(_near=True), on=key, how="left")[
            "_near"].notna().to_numpy()
        moved = moved.copy()
        alone = again & since.notna().to_numpy()
        moved[alone] = _moved_with(obs[again], rules, since[again])[since[again].notna()
                                                                    ].to_numpy()
        job_wide = obs["outlier"] & ((moved > allowed) | lagging)
    overtaken = _overtaken(obs, prev, prev_line, sign)
    job_wide = job_wide | overtaken
    return obs.assign(outlier=obs["outlier"] & ~job_wide, job_wide=job_wide,
                      overtaken=overtaken)


def peers(obs: pd.DataFrame, key: list[str], min_nodes: int) -> tuple[pd.DataFrame, pd.Series]:
    """Each row with its peer group's (key) size n and median value, groups under min_nodes
    dropped, and the group's relative robust spread (1.4826 MAD over the |median|; inf where
    the median is 0). The sweeps (judge_slots) and the jobs as wholes (recurring.py) pool
    their peers here."""
    g = obs.groupby(key, sort=False)["value"]
    obs = obs.assign(n=g.transform("size"), median=g.transform("median"))
    obs = obs[obs["n"] >= min_nodes]
    if obs.empty:
        return obs, pd.Series(dtype=float)
    absdev = (obs["value"] - obs["median"]).abs()
    mad = absdev.groupby([obs[c] for c in key], sort=False).transform("median")
    med_abs = obs["median"].abs()
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(med_abs > 0, MAD_SCALE * mad / med_abs.where(med_abs > 0, 1.0), np.inf)
    return obs, pd.Series(rel, index=obs.index)


def lines(obs: pd.DataFrame, rel: np.ndarray, rules: Rules
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each row's line against its peers (obs: metric, value, median; rel: the peers'
    relative robust spread): the tolerance (the qualification judge's own rule, one door,
    within the metric's floor and cap), the line (that share of the median, or the metric's
    min_delta when larger), how far past the median the value is in the metric's bad
    direction, and whether past its line. The sweeps (judge_slots) and the jobs as wholes
    (recurring.py) draw their lines here."""
    sign = _per_metric(obs["metric"], rules, lambda r: r.sign)
    min_delta = _per_metric(obs["metric"], rules, lambda r: r.min_delta)
    cap = _per_metric(obs["metric"], rules, lambda r: r.max_margin or rules.max_margin)
    floor = _per_metric(obs["metric"], rules, lambda r: r.min_margin or rules.min_margin)
    with np.errstate(over="ignore", invalid="ignore"):
        tol = tolerances(rel, rules.k, floor, cap)
    median = obs["median"].to_numpy(dtype=float)
    line = np.maximum(tol * np.abs(median), min_delta)
    bad = sign * (obs["value"].to_numpy(dtype=float) - median)
    return tol, line, bad, (bad > line) & (bad > 0)


def _deviation(bad: np.ndarray, line: np.ndarray, k: float) -> np.ndarray:
    """How far past its line a value is, in units where the line is k (`bad`: its signed
    distance from the median in the bad direction)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(line > 0, bad * k / line, np.where(bad > 0, np.inf, 0.0))


def _median_before(obs: pd.DataFrame) -> np.ndarray:
    """Each row's group median (job, group, metric) in the slot before its own; NaN where
    that slot has none."""
    key = ["job_id", "group", "metric", "slot"]
    med = obs.groupby(key, sort=False)["median"].first().rename("prev").reset_index()
    med = med.assign(slot=med["slot"] + 1)
    return obs[key].merge(med, on=key, how="left")["prev"].to_numpy(dtype=float)


def _overtaken(obs: pd.DataFrame, prev: np.ndarray, prev_line: np.ndarray,
               sign: np.ndarray) -> np.ndarray:
    """Telemetry rows in line only because their job went past them: the group's median moved
    the bad way since the slot before by more than that slot's line, the node's value is past
    that line from the earlier median (against the level the job was at, it is an outlier),
    and the median is now more than a line past the node (a node that moved with its job is
    the job's move, not passed by it). A checkpoint idling most links to a quarter beside a
    link at half: the slot says nothing of the node, as in a job-wide one. `find_runs` holds
    such a slot beside an outlying one only (a blip inside a run, or an onset when the job is
    back the next slot and the node is not), counts it right after an outlying slot of the same
    component when the node stayed within that slot's line (`_count_stayed`), and it
    does not make the next job-wide slot a second in a row. Causal: only the slot and the one
    before it are read."""
    value = obs["value"].to_numpy(dtype=float)
    cur = obs["median"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        out = (~obs["outlier"].to_numpy() & (obs["source"] == TELEMETRY).to_numpy()
               & (sign * (cur - prev) > prev_line) & (sign * (value - prev) > prev_line)
               & (sign * (cur - value) > obs["line"].to_numpy(dtype=float)))
    return out


def _alone_since(obs: pd.DataFrame) -> pd.Series:
    """For each row whose node was an outlier on its own (`alone`) in the slot before, in its
    job and metric: when that run of such slots began (its first sample's time); NaT for the
    other rows."""
    key = ["job_id", "metric", "node"]
    b = obs[key + ["slot", "time", "alone"]].drop_duplicates(key + ["slot"]).sort_values(
        key + ["slot"])
    g = b.groupby(key, sort=False)
    alone = b["alone"].astype(bool)
    gap = (b["slot"] - g["slot"].shift()) != 1
    starts = ~alone | ~g["alone"].shift(fill_value=False).astype(bool) | gap
    # sorted by slot within a node: a run's first row holds its earliest sample
    run_start = b["time"].where(starts).ffill().where(alone)
    nxt = b[key + ["slot"]].assign(slot=b["slot"] + 1, since=run_start)
    return obs[key + ["slot"]].merge(nxt, on=key + ["slot"], how="left")["since"].set_axis(
        obs.index)


def _lagging(obs: pd.DataFrame, prev: np.ndarray, prev_line: np.ndarray,
             sign: np.ndarray) -> np.ndarray:
    """Outliers that still show the job's previous level, not a new one of their own: the end
    of a job-wide shift (fabric congestion, a slow phase) falls inside a slot, and nodes sample
    at their own phase, so the nodes that sampled before the end show the shift for one more
    slot, few enough to pass as outliers. Such an outlier is the job's, judged like a job-wide
    slot (it neither counts toward nor breaks a run; a second in a row ends it) when all of:
    its group's median came back from the bad side by more than its line since the slot
    before; its value is within a line of that earlier median; and the job's nodes that
    sampled before it in the slot (at least one) were, by their median, at least half as far
    past their groups' medians in the same direction: the shift was still on when it sampled.
    A node that turns slow as its job recovers is alone among the earlier samplers, and one
    far worse than its peers ever were is not at the earlier level: both are judged as
    before. Causal: only the slot and the one before it are read."""
    out = np.zeros(len(obs), dtype=bool)
    value = obs["value"].to_numpy(dtype=float)
    cur = obs["median"].to_numpy(dtype=float)
    line = obs["line"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        cand = (obs["outlier"].to_numpy() & (sign * (prev - cur) > line)
                & (np.abs(value - prev) <= prev_line))
    if not cand.any():
        return out
    slot_key = ["job_id", "metric", "slot"]
    bad = obs[slot_key + ["node", "time"]].assign(bad=sign * (value - cur))
    mine = bad[cand].assign(row=np.flatnonzero(cand))
    pairs = mine.merge(bad, on=slot_key, suffixes=("", "_other"))
    pairs = pairs[(pairs["node_other"] != pairs["node"])
                  & (pairs["time_other"] <= pairs["time"])]
    earlier = pairs.groupby("row")["bad_other"].median()
    at = earlier.index.to_numpy(dtype=int)
    out[at] = earlier.to_numpy(dtype=float) >= mine.set_index("row").loc[at, "bad"] / 2
    return out


def _moved_with(obs: pd.DataFrame, rules: Rules, since: pd.Series | None = None) -> pd.Series:
    """For each outlier, how many of its job's nodes (itself included) are past the job's
    median in the same metric and direction by at least half as much as it is, in its slot, or
    in a slot either side by a like amount (at most its own move plus its line): nodes sample
    at their own phase, so a shift that begins or ends inside a slot shows on part of them
    only; a one-sweep event far bigger than the outlier's move next door (a checkpoint idling
    links to a quarter beside a link at half) is another event. Next door counts only a
    sample within one sweep of the outlier's own, or of a node still displaced in the outlier's
    slot by at least half its move next door (a state still on: a leaf's congestion, a stage
    that moves less): another node's one-sweep dip a whole sweep before an onset, back in line
    by the onset's slot, is another moment. The job's median is over every group: a leaf
    switch's nodes span stages. 0 for the nodes that are not outliers."""
    out = pd.Series(0, index=obs.index, dtype="int64")
    if not obs["outlier"].any():
        return out
    key = ["job_id", "metric", "slot"]
    jm = obs[obs.groupby(["job_id", "metric"], sort=False)["outlier"].transform("any")]
    sign = _per_metric(jm["metric"], rules, lambda r: r.sign)
    job_med = jm.groupby(key, sort=False)["value"].transform("median")
    bad = jm.assign(bad=sign * (jm["value"] - job_med).to_numpy(dtype=float))
    bad = bad.assign(held=_held_for(bad))
    # each node's moves in slots s-1, s, s+1, for every slot s
    spread = pd.concat([bad.assign(slot=bad["slot"] + d, d=d) for d in (-1, 0, 1)])
    near = spread[["job_id", "metric", "slot", "node", "d", "bad", "time", "outlier",
                   "held"]].rename(columns={"bad": "near", "time": "near_time",
                                            "outlier": "near_outlier", "held": "near_held"})
    xstart = since.reindex(bad.index) if since is not None else pd.Series(pd.NaT, bad.index)
    # with `since`, only the outliers it can change are counted (the others keep the count
    # of the pass without it)
    counted = bad["outlier"] & (xstart.notna() if since is not None else True)
    if since is None:
        # Decided in its own slot alone: more of the job's nodes at least half as far as the
        # outlier there than the slot allows (a pass without `since` removes no such pair),
        # so the count is past `allowed` whatever the slots beside add (judge_slots compares
        # it with nothing else). A big job's shift: no pairs made for its movers.
        decided = _past_allowed_alone(bad, key, rules)
        out.loc[decided.index] = decided.to_numpy()
        counted = counted & ~bad.index.isin(decided.index)
        if not counted.any():
            return out
    mine = bad.loc[counted, key + ["bad", "line", "time", "held"]].assign(
        row=lambda f: f.index, xnode=bad["node"], xstart=xstart)
    # A node counts beside an outlier only as an outlier itself or at least half as far as
    # it: the rows under half the least outlier's move in their slot never count, and are
    # left out before the pairs are made (a big job's shift pairs every mover with every
    # node: 2,000 nodes, 30% moving, took 57 s and 3.3 GB).
    least = mine.groupby(key, sort=False)["bad"].min().rename("least") / 2
    near = near.merge(least.reset_index(), on=key, how="inner")
    near = near[near["near_outlier"].astype(bool) | (near["near"] >= near["least"])].drop(
        columns="least")
    counts = pd.concat([_count_movers(part, near, bad, key, rules)
                        for part in _chunks(mine, near, key)])
    if len(counts):
        out.loc[counts.index] = counts.to_numpy()
    return out


# Rows in a job's slot from which a shift's outliers are counted alone (_past_allowed_alone).
COUNT_ALONE_FROM = 128


def _past_allowed_alone(bad: pd.DataFrame, key: list[str], rules: Rules) -> pd.Series:
    """Outliers (row -> count) with more nodes of their job, metric and slot at least half as
    far past the job's median as they are (themselves included) than the slot allows (its
    rows, as judge_slots counts them): only in slots with more outliers than that (a shift),
    each counted by a sorted search over the nodes' furthest moves."""
    n = bad.groupby(key, sort=False)["bad"].transform("size").to_numpy()
    allowed = np.maximum(1, np.floor(rules.max_outlier_share * n))
    many = bad["outlier"].groupby([bad[c] for c in key], sort=False).transform("sum").to_numpy()
    # Only big slots: in a small job the pairs are few, and this loop's per-slot cost was more
    # than they saved (the lab's fleets of 4-64-node jobs took 20-30% longer).
    busy = bad[(many > allowed) & (n >= COUNT_ALONE_FROM)]
    if busy.empty:
        return pd.Series(dtype="int64")
    found: dict = {}
    for _, g in busy.groupby(key, sort=False):
        # nodes, not rows: a job's step times put a node in a slot once per stage or section
        # (each node's furthest move is the one that counts)
        vals = np.sort(g.groupby("node", sort=False)["bad"].max().to_numpy(dtype=float))
        outl = g[g["outlier"].to_numpy(dtype=bool)]
        b = outl["bad"].to_numpy(dtype=float)
        with np.errstate(invalid="ignore"):
            c = len(vals) - np.searchsorted(vals, b / 2, side="left")
        lim = np.maximum(1, np.floor(rules.max_outlier_share * len(g)))  # as judge_slots
        for row, count in zip(outl.index[c > lim], c[c > lim], strict=True):
            found[row] = int(count)
    return pd.Series(found, dtype="int64")


# Rows of outlier x node pairs made at once in _moved_with (memory: a few hundred MB at most).
PAIRS_AT_ONCE = 2_000_000


def _chunks(mine: pd.DataFrame, near: pd.DataFrame, key: list[str]) -> list[pd.DataFrame]:
    """`mine` cut so that each part pairs with at most about PAIRS_AT_ONCE rows of `near`."""
    per = mine[key].merge(near.groupby(key, sort=False).size().rename("k").reset_index(),
                          on=key, how="left")["k"].fillna(0).to_numpy()
    cut = np.cumsum(per) // PAIRS_AT_ONCE
    return [mine[cut == c] for c in np.unique(cut)] if len(mine) else [mine]


def _count_movers(mine: pd.DataFrame, near: pd.DataFrame, bad: pd.DataFrame, key: list[str],
                  rules: Rules) -> pd.Series:
    """_moved_with's count for these outliers (`mine`): row -> nodes moved with it."""
    pairs = mine.merge(near, on=key, how="inner")
    # in its own slot, any node at least half as far; in a slot either side, only a like move
    # (no more than a line past the outlier's): the same shift caught at another phase. A
    # one-sweep event far bigger next door (a checkpoint idling links to a quarter) is not the
    # move that made this node an outlier. Next door, a sample taken within one sweep of the
    # outlier's own (a shift that began, or a one-sweep event that fell, between two nodes'
    # samples shows on both at most slot_s apart; a job's step times share one clock, so their
    # slots are exactly slot_s apart and always count), or a sample of a node still displaced
    # in the outlier's slot by at least half that move (a state still on, whose level next door
    # is the same state's: a leaf's congestion, a stage that moves less; "past its own line"
    # missed a stage inside its line). Another node's one-sweep dip a whole sweep before an
    # onset, back in line by the onset's slot, is another moment, not this node's move.
    # In its own slot, also any node past its own line the same way, however much less far
    # (the section's rule: more than max_outlier_share of a slot's nodes outlying is the job's
    # or the fabric's): a switch's event gives its nodes levels that differ by a factor of two
    # or more, and the one that caught the most is not alone.
    # ("however much less far" is of a node whose state began with the outlier's or after it:
    # one displaced for longer, by less than half as much, is in a state of its own, a role
    # the job did not name or an older shift, and not the move that made this node an outlier)
    own = ((pairs["d"] == 0) & pairs["near_outlier"].astype(bool)
           & (pairs["near_held"] <= pairs["held"] + 1))
    pairs = pairs[own | ((pairs["near"] >= pairs["bad"] / 2)
                         & ((pairs["d"] == 0) | (pairs["near"] <= pairs["bad"] + pairs["line"])))]
    apart = (pairs["d"] != 0) & ((pairs["near_time"] - pairs["time"]).abs()
                                 > np.timedelta64(rules.slot_s, "s"))
    if apart.any():
        now = bad[key + ["node", "bad"]].drop_duplicates(key + ["node"]).rename(
            columns={"bad": "now"})
        far = pairs.loc[apart, key + ["node", "near"]].merge(now, on=key + ["node"], how="left")
        still = (far["now"] >= far["near"] / 2).to_numpy()
        pairs = pairs[~apart.to_numpy() | np.isin(np.arange(len(pairs)),
                                                  np.flatnonzero(apart.to_numpy())[still])]
    pairs = pairs[~_moved_later(pairs, bad)]
    return pairs.groupby("row")["node"].nunique()


def _held_for(bad: pd.DataFrame) -> np.ndarray:
    """For each row of `bad` (a node's displacement `bad` from its job's median, per job,
    metric and slot): for how many slots right before it the node was displaced the same way
    by at least half as much (up to HELD_SLOTS; 0 for a row not displaced, or whose slot
    before is missing or in line)."""
    b = bad[["job_id", "metric", "node", "slot", "bad"]].sort_values(
        ["job_id", "metric", "node", "slot"])
    value = b["bad"].to_numpy(dtype=float)
    slot = b["slot"].to_numpy()
    grp = b.groupby(["job_id", "metric", "node"], sort=False).ngroup().to_numpy()
    held = np.zeros(len(b), dtype=np.int64)
    on = value > 0
    for k in range(1, HELD_SLOTS + 1):
        if not on.any():
            break
        prev = np.full(len(b), np.nan)
        prev[k:] = value[:-k]
        ok = np.zeros(len(b), dtype=bool)
        ok[k:] = (grp[k:] == grp[:-k]) & (slot[k:] - slot[:-k] == k)
        with np.errstate(invalid="ignore"):
            on = on & ok & (prev >= value / 2)
        held[on] = k
    out = np.empty(len(b), dtype=np.int64)
    out[bad.index.get_indexer(b.index)] = held
    return out


def _moved_later(pairs: pd.DataFrame, bad: pd.DataFrame) -> np.ndarray:
    """Pairs whose outlier was on its own in the slot before (`xstart`: when that state was
    first seen) and whose other node's move began after it: that node's sample in the slot
    before its move was in line (under half its move) and taken no earlier than `xstart`.
    Such a move is another event (a one-sweep dip, a fault of its own) that came later; the
    outlier's state was not the job's shift, and it is not made one by it. A move whose slot
    before has no sample, or began before the outlier's state was seen (a fabric event caught
    by each node at its own phase), still counts; so does every move beside an outlier whose
    slot before was the job's (a staggered event: checkpoint writes one node after another)."""
    other = (pairs["node"] != pairs["xnode"]).to_numpy() & pairs["xstart"].notna().to_numpy()
    if not other.any():
        return np.zeros(len(pairs), dtype=bool)
    before = (bad[["job_id", "metric", "node", "slot", "bad", "time"]]
              .assign(slot=bad["slot"] + 1)
              .rename(columns={"bad": "before", "time": "before_time"})
              .drop_duplicates(["job_id", "metric", "node", "slot"]))
    own = pairs[["job_id", "metric", "node"]].assign(
        slot=(pairs["slot"] - pairs["d"]).to_numpy())
    prior = own.merge(before, on=["job_id", "metric", "node", "slot"], how="left")
    with np.errstate(invalid="ignore"):
        fresh = (prior["before"].to_numpy(dtype=float) < pairs["near"].to_numpy(dtype=float) / 2)
    after = (prior["before_time"] >= pairs["xstart"].to_numpy()).to_numpy(dtype=bool)
    return other & fresh & after


def _adjacency(o: pd.DataFrame, key: list[str]) -> tuple[pd.Series, pd.Series]:
    """For rows sorted by key and slot: whether each row has the row before's key (same), and
    whether it is that key's next slot (adjacent)."""
    same = (o[key] == o[key].shift()).all(axis=1)
    return same, same & (o["slot"] - o["slot"].shift() == 1)


def find_runs(obs: pd.DataFrame, rules: Rules, suspects: Collection[str] = ()) -> pd.DataFrame:
    """Runs of consecutive outlying slots per (job, node, group, metric) that reached the
    metric's persist_sweeps: since, last, confirmed (the slot that completed persistence), the
    node's and its peers' medians over the run, the median deviation.

    Persistence is of the same thing, not of chance: a run goes on only while the outlying
    component stays the same (the GPU, the HCA port, the rank slowest most often), unless both
    slots are at least STRONG lines past (a whole node gone bad, whose worst GPU or slowest
    rank may change from sweep to sweep). A healthy node's one-sweep jitters land on a new GPU
    or port each time, and a workload's slowest rank rotates (sequence lengths by data shard):
    neither persists. A slot in which the node was past its line while the job moved with it
    (job_wide) neither counts nor breaks a run, once: a checkpoint or a fabric blip says
    nothing either way about the node; a second such slot in a row ends the run (a node that
    moves with its job for longer is part of the job's shift, e.g. a leaf switch's).

    `suspects`: nodes whose onset an earlier window saw (an open suspect episode). A window
    reads lookback_min of history, so for a node slow since before it the window's first slots
    are already slow: the role and steady-offset tests below, which excuse a node off its peers
    from its start, would excuse a suspect whose onset merely fell out of the window, and its
    evidence would stop renewing while it stays slow. Their runs are never excused so."""
    cols = ["job_id", "node", "group", "metric", "source", "since", "last", "confirmed",
            "value", "peer_median", "deviation", "slots", "component", "fleet_waited"]
    if obs.empty or not obs["outlier"].any():
        return pd.DataFrame(columns=cols)
    key = ["job_id", "node", "group", "metric"]
    held = obs["outlier"] | obs["job_wide"]
    o = obs[held].sort_values(key + ["slot"]).reset_index(drop=True)
    same, adjacent = _adjacency(o, key)
    # a slot its job went past it in (`_overtaken`) is held beside an outlying slot only: a
    # blip inside a run, or a run's onset; beside another job-wide slot it says nothing
    over = o["overtaken"].to_numpy(dtype=bool)
    if over.any():
        out = o["outlier"].to_numpy()
        beside = ((adjacent.to_numpy() & np.append(False, out[:-1]))
                  | (np.append(adjacent.to_numpy()[1:], False) & np.append(out[1:], False)))
        keep = ~over | beside
        o, over = o[keep].reset_index(drop=True), over[keep]
        same, adjacent = _adjacency(o, key)
        # ... and counts, as the node's own, when it comes right after an outlying slot of the
        # same component and the node stayed there (within that slot's line): the job went
        # past a node that did not move (a checkpoint idling the other links to a quarter the
        # sweep after one went to x8), judged against the level the job was at. Causal: this
        # slot and the one before.
        o, over = _count_stayed(o, over, adjacent.to_numpy(), rules)
    # a job-wide slot right after another one the node moved with its job in: the run ends
    # before it (the job going past the node is not the node moving with it)
    with_job = pd.Series(o["job_wide"].to_numpy() & ~over, index=o.index) if over.any() \
        else o["job_wide"]
    second = (o["job_wide"] & adjacent & with_job.shift(fill_value=False)).to_numpy()
    # ... unless the node's own displacement began in the job-wide slot before (it was in
    # line, or not half as far, in the slot before that): then the slot may still be an onset
    # (`_onset_on_an_event`: the node stayed in the next slot, where every node that moved with
    # it is back), and ends the run only if it is not. A node displaced with its job for longer
    # (a leaf's congestion it shared) ends its run here, as ever.
    fresh = np.zeros(len(o), dtype=bool)
    if second.any():
        fresh[np.flatnonzero(second)[_displaced_for(obs, o[second], rules) <= 1]] = True
    o = o[~(second & ~fresh)].assign(_second=fresh[~(second & ~fresh)]).reset_index(drop=True)
    same, adjacent = _adjacency(o, key)
    o = _onset_on_an_event(obs, o, adjacent.to_numpy(),
                           o["component"].fillna("").astype(str).to_numpy(), rules)
    o = o[~(o["_second"] & o["job_wide"])].drop(columns="_second").reset_index(drop=True)
    same, adjacent = _adjacency(o, key)
    comp = o["component"].fillna("").astype(str)
    strong = o["deviation"].to_numpy(dtype=float) >= STRONG * rules.k
    strong &= ~_per_metric(o["metric"], rules, lambda r: r.same_component, False, bool)
    # the component and strength of the last outlying slot before each row (in its key)
    mark = pd.Series(np.arange(len(o)), index=o.index).where(o["outlier"]).groupby(
        [o[c] for c in key], sort=False).ffill().shift()
    mark = mark.where(same)
    have = mark.notna().to_numpy()
    at = mark.fillna(0).astype(int).to_numpy()
    prev_comp = np.where(have, comp.to_numpy()[at], "")
    prev_strong = np.where(have, strong[at], False)
    continues = (~o["outlier"].to_numpy() | ~have | (comp.to_numpy() == prev_comp)
                 | (strong & prev_strong))
    continues &= ~_count_fell(o, at, have, rules)
    o = o.assign(run=(~(adjacent.to_numpy() & continues)).cumsum())
    need = o["metric"].map({m: r.persist or rules.persist_sweeps
                            for m, r in rules.metrics.items()}).fillna(rules.persist_sweeps)
    o = o.assign(pos=o["outlier"].astype(int).groupby(o["run"]).cumsum())
    # a run that needs corroboration and has none yet waits one sweep more, and so does one
    # not yet rare by the fleet's own rate of one-sweep excursions (a budget of 0: no such
    # rule); a metric under both waits until both hold, and never more than one sweep
    budget = rules.fleet_chance_per_node_day * rules.slot_s / 86400.0
    outlying = o["outlier"].to_numpy()

    def until(holds: np.ndarray, metrics: list[str]) -> pd.Series:  # not yet, in its run
        so_far = pd.Series((holds & outlying).astype(int), index=o.index)
        return o["metric"].isin(metrics) & ~(so_far.groupby(o["run"]).cumsum() > 0)

    waits = until(_corroborated(obs, o, rules),
                  [m for m, r in rules.metrics.items() if r.corroborated_by])
    chance_waits = pd.Series(False, index=o.index)
    if budget > 0:
        rare = np.nan_to_num(_chance(obs, o, rules), nan=np.inf) <= budget
        chance_waits = until(rare, [m for m, r in rules.metrics.items() if r.fleet_chance])
    waits |= chance_waits
    hit = o[o["outlier"] & (o["pos"] >= need + waits.astype(int))].drop_duplicates("run")
    # fleet_waited: the run was confirmed a sweep past persist_sweeps for the fleet's rate
    confirmed = hit.set_index("run")["time"].rename("confirmed").to_frame().assign(
        fleet_waited=chance_waits[hit.index].to_numpy(dtype=bool))
    o = o[o["outlier"] & o["run"].isin(confirmed.index)]
    known = set(suspects)
    o = o[~o["run"].isin(_role_runs(obs, o[~o["node"].isin(known)], key))]
    o = o[~o["run"].isin(_steady_runs(obs, o[~o["node"].isin(known)], key, rules))]
    if o.empty:
        return pd.DataFrame(columns=cols)
    runs = (o.groupby("run").agg(job_id=("job_id", "first"), node=("node", "first"),
                                 group=("group", "first"), metric=("metric", "first"),
                                 source=("source", "first"), since=("time", "min"),
                                 last=("time", "max"), value=("value", "median"),
                                 peer_median=("median", "median"),
                                 deviation=("deviation", "median"), slots=("slot", "size"))
            .join(confirmed, how="inner").join(_mode(o["run"], o["component"])))
    return runs.reset_index(drop=True)[cols]


def _count_stayed(o: pd.DataFrame, over: np.ndarray, adjacent: np.ndarray,
                  rules: Rules) -> tuple[pd.DataFrame, np.ndarray]:
    """`o` (sorted by key and slot) with each row the job went past the node in (`over`) made
    outlying where the row before is the same key's previous slot, outlying, on the same
    component, and within its line of this row's value; such a row takes that row's median
    and line, and its deviation from them (the level the job was at: what the evidence says).
    The new `over`."""
    out = o["outlier"].to_numpy()
    comp = o["component"].fillna("").astype(str).to_numpy()
    value = o["value"].to_numpy(dtype=float)
    line = o["line"].to_numpy(dtype=float)
    before = np.append(False, out[:-1]) & adjacent
    with np.errstate(invalid="ignore"):
        like = np.abs(value - np.append(np.nan, value[:-1])) <= np.append(np.nan, line[:-1])
    stayed = over & before & (comp == np.append("", comp[:-1])) & like
    if not stayed.any():
        return o, over
    at = np.flatnonzero(stayed)
    median = o["median"].to_numpy(dtype=float).copy()
    median[at], line = median[at - 1], line.copy()
    line[at] = line[at - 1]
    sign = _per_metric(o["metric"], rules, lambda r: r.sign)
    deviation = o["deviation"].to_numpy(dtype=float).copy()
    deviation[at] = _deviation(sign[at] * (value[at] - median[at]), line[at], rules.k)
    return o.assign(outlier=out | stayed, job_wide=o["job_wide"].to_numpy() & ~stayed,
                    overtaken=over & ~stayed, median=median, line=line,
                    deviation=deviation), over & ~stayed


def _displaced_for(obs: pd.DataFrame, rows: pd.DataFrame, rules: Rules) -> np.ndarray:
    """For each of `rows` (judged rows of obs): for how many slots right before it its node
    was displaced from its group's median the same way by at least half as much (`_held_for`,
    up to HELD_SLOTS), in its own group."""
    key = ["job_id", "group", "metric", "node"]
    part = obs.merge(rows[key].drop_duplicates(), on=key, how="inner")
    sign = _per_metric(part["metric"], rules, lambda r: r.sign)
    # one history per (job, group, metric, node): a node whose ranks run two stages has two
    part = part.assign(bad=sign * (part["value"] - part["median"]).to_numpy(dtype=float),
                       node=part["node"].astype(str) + "\0" + part["group"].astype(str))
    part = part.assign(held=_held_for(part.reset_index(drop=True)).astype(np.int64))
    at = rows[key + ["slot"]].assign(
        node=rows["node"].astype(str) + "\0" + rows["group"].astype(str))
    return at.merge(part[key + ["slot", "held"]], on=key + ["slot"],
                    how="left")["held"].fillna(0).to_numpy()


def _onset_on_an_event(obs: pd.DataFrame, o: pd.DataFrame, adjacent: np.ndarray,
                       comp: np.ndarray, rules: Rules) -> pd.DataFrame:
    """The first slot of a node's run counts as outlying though the job moved with it (job-
    wide) when the job's move was over by the next slot and the node's was not: in that next
    slot the node is an outlier at a like value (within its line) on the same component, and
    every other node that moved at least half as far in the first slot or the one before is
    back to under half that move (no sample: not known to be back). The onset fell on a
    one-sweep event (a checkpoint idling links, one sweep of a phase) and the node stayed
    where it went. A leaf
    switch's congestion or a phase keeps its nodes displaced (not counted, as before), and a
    job-wide slot between two outlying ones is still a blip (counting it would confirm the run
    at a slot whose judgement needs the next). Telemetry only, and not `counts` metrics (a
    fabric event's late samplers count errors alone at its level the slot after); step times
    share one clock and their job-wide slots are the workload's phases."""
    jw = o["job_wide"].to_numpy()
    if not jw.any():
        return o
    counted = _per_metric(o["metric"], rules, lambda r: r.counts, False, bool)
    value = o["value"].to_numpy(dtype=float)
    outlier = o["outlier"].to_numpy()

    def after(a: np.ndarray, fill: object) -> np.ndarray:  # each row's next row's value
        return np.append(a[1:], np.asarray([fill], dtype=a.dtype))

    nxt = np.append(adjacent[1:], False)  # the next row is this key's next slot
    sign_o = _per_metric(o["metric"], rules, lambda r: r.sign)
    line = o["line"].to_numpy(dtype=float)
    median = o["median"].to_numpy(dtype=float)
    overtaken = o["overtaken"].to_numpy(dtype=bool)
    # no outlying slot right before, nor a slot its job went past it in (held only beside an
    # outlying one: a run is on)
    first = ~(adjacent & np.append(False, (outlier | overtaken)[:-1]))
    with np.errstate(invalid="ignore"):
        like = np.abs(value - after(value, np.nan)) <= after(o["line"].to_numpy(dtype=float),
                                                             np.nan)
    cand = (jw & first & ~counted & (o["source"] == TELEMETRY).to_numpy() & nxt
            & after(outlier, False) & (after(comp, "") == comp) & like)
    if not cand.any():
        return o
    # A slot its job overtook it in (`_overtaken`: in line only because the group's median
    # moved past it) counts when the group's median is back by more than the slot's line in
    # the next: the job's move was over and the node stayed where it went.
    over = cand & overtaken
    with np.errstate(invalid="ignore"):
        back = sign_o * (median - after(median, np.nan)) > line
    promote = over & back
    cand &= ~over
    if not cand.any():
        return o.assign(outlier=outlier | promote, job_wide=jw & ~promote,
                        overtaken=overtaken & ~promote)
    # the job's move in the slot and the next: each node off the job's median (every group)
    key = ["job_id", "metric", "slot"]
    jm = obs[obs["job_id"].isin(o.loc[cand, "job_id"]) & obs["metric"].isin(o.loc[cand, "metric"])]
    sign = _per_metric(jm["metric"], rules, lambda r: r.sign)
    bad = jm[key + ["node"]].assign(
        bad=sign * (jm["value"] - jm.groupby(key, sort=False)["value"].transform("median"))
        .to_numpy(dtype=float))
    mine = o.loc[cand, key + ["node"]].assign(row=np.flatnonzero(cand))
    mine = mine.merge(bad, on=key + ["node"], how="left")
    # those that moved in the slot, or in the slot before (what made it the job's may have
    # been sampled there: a shift caught at another phase)
    around = pd.concat([bad, bad.assign(slot=bad["slot"] + 1)], ignore_index=True)
    movers = mine.merge(around, on=key, suffixes=("", "_other"))
    movers = movers[(movers["node_other"] != movers["node"])
                    & (movers["bad_other"] >= movers["bad"] / 2)]
    later = bad.assign(slot=bad["slot"] - 1).rename(columns={"node": "node_other",
                                                             "bad": "bad_next"})
    movers = movers.merge(later, on=key + ["node_other"], how="left")
    still = ~(movers["bad_next"] < movers["bad_other"] / 2)  # NaN (no sample): still on
    held = set(movers.loc[still.to_numpy(), "row"])
    promote[[r for r in np.flatnonzero(cand) if r not in held]] = True
    return o.assign(outlier=outlier | promote, job_wide=jw & ~promote,
                    overtaken=overtaken & ~promote)


def _corroborated(obs: pd.DataFrame, o: pd.DataFrame, rules: Rules) -> np.ndarray:
    """Rows of a metric with `corroborated_by` whose slot vouches for a fault on its component:
    at least STRONG lines past (not for a `same_component` metric, whose count over peers that
    count none is many lines past at its first error), or one of the other metrics' samples of
    the same node and slot names the same component (any, for the step-time metric: its
    component is a rank) at least half a line on its bad side (deviation >= k / 2)."""
    out = np.zeros(len(o), dtype=bool)
    for metric, rule in rules.metrics.items():
        mine = (o["metric"] == metric).to_numpy()
        if not rule.corroborated_by or not mine.any():
            continue
        if not rule.same_component:
            out |= mine & (o["deviation"].to_numpy(dtype=float) >= STRONG * rules.k)
        for other in rule.corroborated_by:
            if other not in rules.metrics:
                continue
            on = ["job_id", "node", "slot"] + ([] if other == rules.steps_metric
                                               else ["component"])
            word = obs.loc[(obs["metric"] == other) & (obs["deviation"] >= rules.k / 2), on]
            if word.empty:
                continue
            rows = o.loc[mine, on].reset_index()
            agree = rows.merge(word.drop_duplicates(on), on=on, how="inner")
            out[o.index.get_indexer(agree["index"].unique())] = True
    return out


def _excursions(obs: pd.DataFrame, metric: str) -> tuple[int, pd.DataFrame]:
    """The fleet's own one-sweep excursions of a metric in the judged window: the number of
    node-slots judged with a judged slot of the same node right before and after (each one a
    chance for such an excursion), and, of those, the ones outlying alone (neither neighbour
    outlying nor moving with its job): their component and deviation. A node going bad stays
    out (its slots are outlying in a row); so do the job's shifts (job-wide slots)."""
    key = ["job_id", "node", "group"]
    f = obs.loc[obs["metric"] == metric, key + ["slot", "outlier", "job_wide", "deviation",
                                              "component"]].sort_values(key + ["slot"])
    before = _adjacency(f, key)[1].to_numpy()
    after = np.append(before[1:], False)
    off = (f["outlier"] | f["job_wide"]).to_numpy(dtype=bool)
    alone = (f["outlier"].to_numpy(dtype=bool) & ~np.append(False, off[:-1])
             & ~np.append(off[1:], False))
    judged = before & after
    out = f.loc[judged & alone, ["component", "deviation"]]
    return int(judged.sum()), out.assign(component=out["component"].fillna("").astype(str))


def _survival_logs(exc: pd.DataFrame, judged: int, d: np.ndarray,
                   same_component: bool) -> np.ndarray:
    """log S_c(d) for each deviation in `d` (rows) and each component c of the excursions
    (columns; one column, all of them, unless `same_component`): the share of the `judged`
    node-slots that were an excursion on c at least d lines past. None as large: NO_CHANCE
    (a log 0 kept finite: pandas' grouped cumsum makes -inf + -inf NaN; exp() of it is 0)."""
    parts = (exc.groupby("component", sort=False)["deviation"] if same_component
             else [("", exc["deviation"])])
    logs = []
    for _, devs in parts:
        s = np.sort(devs.to_numpy(dtype=float))
        with np.errstate(divide="ignore"):
            logs.append(np.maximum(np.log((len(s) - np.searchsorted(s, d, side="left"))
                                          / judged), NO_CHANCE))
    return np.column_stack(logs)


def _chance(obs: pd.DataFrame, o: pd.DataFrame, rules: Rules) -> np.ndarray:
    """Each outlying row of a `fleet_chance` metric in `o` (sorted, with its `run`): the chance,
    per node-slot, that a healthy node shows the run's outlying slots so far by the fleet's own
    rate: S(d), the share of the window's judged node-slots that were a one-sweep excursion at
    least d lines past (`_excursions`), multiplied over the run's slots; for a `same_component`
    metric counted per component c (S_c: the excursions on c) and summed over the components,
    the chance of such a run on any one of them. No excursion as large in the window: 0. Other
    rows: NaN."""
    out = np.full(len(o), np.nan)
    outlying = o["outlier"].to_numpy(dtype=bool)
    for metric, rule in rules.metrics.items():
        mine = outlying & (o["metric"] == metric).to_numpy()
        if not rule.fleet_chance or not mine.any():
            continue
        judged, exc = _excursions(obs, metric)
        if not judged or exc.empty:
            out[mine] = 0.0
            continue
        logs = _survival_logs(exc, judged, o.loc[mine, "deviation"].to_numpy(dtype=float),
                              rule.same_component)
        total = pd.DataFrame(logs).groupby(o.loc[mine, "run"].to_numpy(), sort=False).cumsum()
        out[mine] = np.exp(total.to_numpy()).sum(axis=1)
    return out


@dataclass(frozen=True)
class FleetRate:
    """One judged metric's one-sweep excursions in a window (`fleet_rates`), what the
    `fleet_chance` rule reads: judged node-slots, excursions among them, their size in lines
    past (median, 90th percentile), and the chance a node-day of two of the median size in a
    row (on one component, for a same_component metric) against the budget."""
    metric: str
    fleet_chance: bool
    judged: int
    excursions: int
    median_lines: float
    p90_lines: float
    pair_per_node_day: float
    budget_per_node_day: float

    @property
    def rate(self) -> float:
        return self.excursions / self.judged if self.judged else 0.0

    @property
    def pair_over_budget(self) -> bool:
        """Whether two excursions of the median size in a row are more common than the budget
        allows (a budget of 0: no budget), the rule on for the metric or not."""
        return 0 < self.budget_per_node_day < self.pair_per_node_day

    @property
    def pair_waits(self) -> bool:
        """Whether such a pair waits a sweep more: over the budget, the rule on."""
        return self.fleet_chance and self.pair_over_budget

    def as_dict(self) -> dict:
        """JSON's own values: a size past any float (a counter that jumped) is None."""
        out = {**{f: getattr(self, f) for f in self.__dataclass_fields__},
               "rate": self.rate, "pair_waits": self.pair_waits}
        return {k: None if isinstance(v, float) and not np.isfinite(v) else v
                for k, v in out.items()}


def fleet_rates(obs: pd.DataFrame, rules: Rules) -> list[FleetRate]:
    """Every judged metric's fleet rate in the judged frame `obs` (`judged`), its own or not:
    an operator's view of what `fleet_chance` reads, and of what it would read where it is
    off."""
    out = []
    per_day = 86400.0 / rules.slot_s
    for metric in sorted(set(obs["metric"]) & set(rules.metrics)):
        rule = rules.metrics[metric]
        judged, exc = _excursions(obs, metric)
        lines = exc["deviation"].to_numpy(dtype=float) / rules.k
        median = p90 = pair = 0.0
        if judged and len(lines):
            # sizes that are there (no interpolation: two past any float give inf, not NaN)
            median, p90 = (float(q) for q in np.quantile(lines, [0.5, 0.9], method="lower"))
            logs = _survival_logs(exc, judged, np.array([median * rules.k]), rule.same_component)
            pair = float(np.exp(2 * logs).sum() * per_day)
        out.append(FleetRate(metric, rule.fleet_chance, judged, len(lines), median, p90, pair,
                             rules.fleet_chance_per_node_day))
    return out


def _count_fell(o: pd.DataFrame, at: np.ndarray, have: np.ndarray, rules: Rules) -> np.ndarray:
    """Rows of a `counts` metric whose count over the peers' median fell to under half the
    previous outlying slot's, and by more than 3 Poisson sigmas of the two (the interval taken
    as slot_s): such a slot starts a run of its own."""
    counted = _per_metric(o["metric"], rules, lambda r: r.counts, False, bool)
    if not counted.any():
        return np.zeros(len(o), dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):  # a count past 1e300: inf, no drop
        excess = np.maximum(0.0, (o["value"].to_numpy(dtype=float)
                                  - o["median"].to_numpy(dtype=float)) * rules.slot_s)
        before = np.where(have, excess[at], 0.0)
        drop = before - excess
        return (counted & have & o["outlier"].to_numpy() & (excess < before / 2)
                & (drop > 3.0 * np.sqrt(before + excess)))


def _role_runs(obs: pd.DataFrame, o: pd.DataFrame, key: list[str]) -> set:
    """Runs that are a role the job did not name, not a fault (the change-point test): the
    node was off its peers from its first judged slot in the job (no onset: it was always
    different; its later runs too) and, in at least half of the run's slots, another node of
    the job was off in the same metric by a like amount (within a factor of 2): a pipeline
    stage or a kind of rank whose work is heavier, e.g. a last stage the step file does not
    name. A node that goes bad during the job has an onset; one bad from the start is alone.
    Step times only: a role sets how long a rank's step takes, not its links' width or its
    GPUs' throttling, so two nodes with links downtrained from the start are two suspects."""
    o = o[o["source"] == STEPS]
    if o.empty:
        return set()
    obs = obs[obs["source"] == STEPS]
    first = obs.groupby(key, sort=False)["slot"].min()
    held_from = obs[obs["outlier"]].groupby(key, sort=False)["slot"].min()
    always = (held_from <= first.reindex(held_from.index) + 1).rename("always")
    runs = o.groupby("run").agg(**{c: (c, "first") for c in key}).join(always, on=key)
    early = runs.index[runs["always"].fillna(False).astype(bool)]
    if len(early) == 0:
        return set()
    held = obs.loc[obs["outlier"] | obs["job_wide"],
                   ["job_id", "metric", "slot", "node", "deviation"]]
    mine = o.loc[o["run"].isin(early), ["run", "job_id", "metric", "slot", "node", "deviation"]]
    pairs = mine.merge(held, on=["job_id", "metric", "slot"], suffixes=("", "_other"))
    ratio = pairs["deviation_other"] / pairs["deviation"]
    pairs = pairs[(pairs["node_other"] != pairs["node"]) & (ratio >= 0.5) & (ratio <= 2.0)]
    accompanied = pairs.groupby("run")["slot"].nunique()
    size = mine.groupby("run")["slot"].nunique()
    share = accompanied.reindex(size.index, fill_value=0) / size
    return set(share.index[share >= 0.5])


def _steady_runs(obs: pd.DataFrame, o: pd.DataFrame, key: list[str], rules: Rules) -> set:
    """Runs with no onset (the change-point test against the node itself): the node was
    already off its peers by half a line or more at its start in the job (the less off of its
    first STEADY_SLOTS judged slots), and the run is neither half a line worse than that start
    nor STRONG lines past its peers: a stable per-node offset that crosses the line now and
    then (a rank with a little more work, a smaller share of a GPU, a slower part the job was
    placed on), not a node that went slow. Without an onset the bar is STRONG lines: a node
    far off from its first step (30% slower) is still a suspect, its onset before the job.
    A node that started level with its peers has an onset when it crosses the line, and is
    judged as before. Step times only: telemetry off from the start (a link downtrained, a
    GPU throttling) is a fault whenever it began. The same node steadily off in two jobs of the
    frame is not excused: the offset follows the node, not the work."""
    o = o[o["source"] == STEPS]
    if o.empty:
        return set()
    obs = obs[obs["source"] == STEPS]

    def signed(f: pd.DataFrame) -> pd.Series:  # off the peers' median, in the bad direction
        sign = f["metric"].map({m: r.sign for m, r in rules.metrics.items()}).astype(float)
        return sign * (f["value"] - f["median"]) / f["median"].abs().where(f["median"] != 0)

    off = signed(obs)
    first = obs.assign(off=off).sort_values("slot")
    at_start = (first.assign(rel=first["line"] / first["median"].abs().where(first["median"] != 0))
                .groupby(key, sort=False).head(STEADY_SLOTS).groupby(key, sort=False)
                .agg(start=("off", "min"), rel=("rel", "median")))
    start = at_start["start"]
    # An offset that follows the node into another job, among other peers, is the node's (a
    # slower part, a host fault a job cannot cause): not excused in any job.
    off_jobs = (at_start[at_start["start"] >= 0.5 * at_start["rel"]].reset_index()
                .groupby("node")["job_id"].nunique())
    followed = set(off_jobs.index[off_jobs >= 2])
    rel_line = (o["line"] / o["median"].abs().where(o["median"] != 0)).rename("rel_line")
    run_off = signed(o)
    runs = (o.assign(run_off=run_off, rel_line=rel_line)
            .groupby("run").agg(**{c: (c, "first") for c in key}, run_off=("run_off", "median"),
                                rel_line=("rel_line", "median"))
            .join(start, on=key))
    start, run_off, line = (runs[c].to_numpy(dtype=float) for c in ("start", "run_off",
                                                                       "rel_line"))
    with np.errstate(invalid="ignore"):
        steady = ((start >= 0.5 * line) & (run_off - start < 0.5 * line)
                  & (run_off < STRONG * line))
    return set(runs.index[steady & ~runs["node"].isin(followed).to_numpy()])


def _mode(keys: pd.Series, values: pd.Series) -> pd.Series:
    """The most frequent value per key (the first seen among ties), named component."""
    counts = (pd.DataFrame({"key": keys.to_numpy(), "value": values.astype(str).to_numpy()})
              .groupby(["key", "value"], sort=False).size().rename("n").reset_index())
    best = counts.sort_values("n", ascending=False, kind="stable").drop_duplicates("key")
    return best.set_index("key")["value"].rename("component")


def _detail(rows: pd.DataFrame, latest: pd.Series) -> str:
    med = float(latest["peer_median"])
    off = (float(latest["value"]) - med) / abs(med) * 100 if med else float("inf")
    model, _, stage = str(latest["group"]).partition("|")
    where = f" on {latest['component']}" if latest["component"] else ""
    parts = [f"{latest['metric']} {float(latest['value']):.4g} vs peers' median {med:.4g} "
             f"({off:+.1f}%){where}, {int(rows['slots'].sum())} outlying sweeps"]
    if bool(latest.get("fleet_waited", False)):
        parts.append("confirmed a sweep later: the fleet's healthy ones went as far that often "
                     "(healthctl suspects rates)")
    if stage:
        parts.append(f"stage {stage}")
    if model:
        parts.append(f"GPU {model}")
    jobs = sorted(set(rows["job_id"].astype(str)))
    parts.append(f"job{'s' if len(jobs) > 1 else ''} {', '.join(jobs[:5])}"
                 + (f" and {len(jobs) - 5} more" if len(jobs) > 5 else ""))
    return "; ".join(parts)


def evidence_from_runs(runs: pd.DataFrame) -> list[SuspectEvidence]:
    """One SuspectEvidence per (node, metric, source): every job behind it, the earliest
    start and the latest outlying sweep; values from its latest run."""
    out: list[SuspectEvidence] = []
    if runs.empty:
        return out
    for (node, metric, source), rows in runs.groupby(["node", "metric", "source"], sort=True):
        latest = rows.sort_values(["last", "deviation"]).iloc[-1]
        out.append(SuspectEvidence(
            node=str(node), metric=str(metric), value=float(latest["value"]),
            peer_median=float(latest["peer_median"]), deviation=float(latest["deviation"]),
            since=pd.Timestamp(rows["since"].min()).to_pydatetime(),
            last=pd.Timestamp(rows["last"].max()).to_pydatetime(),
            job_ids=tuple(sorted(set(rows["job_id"].astype(str)))), source=str(source),
            detail=_detail(rows, latest)))
    return out


def judged(samples: pd.DataFrame, membership: pd.DataFrame, steps: pd.DataFrame | None,
           rules: Rules, suspects: Collection[str] = (), now: Any = None) -> pd.DataFrame:
    """Every observation judged (the frame behind the runs: the benchmarks read it);
    `suspects` as for find_runs (their levelled metrics judged as they are); `now` the pass's
    time (None: the newest sample's), for `delivered`."""
    obs = pd.concat([telemetry_observations(samples, membership, rules),
                     step_observations(steps, membership, rules)], ignore_index=True)
    obs = obs.astype({"slot": "int64", "value": "float64"})
    obs = delivered(obs, samples, membership, rules, now)
    return _levelled(obs, judge_slots(obs, rules), rules, suspects)


def delivered(obs: pd.DataFrame, samples: pd.DataFrame | None, membership: pd.DataFrame,
              rules: Rules, now: Any = None) -> pd.DataFrame:
    """`obs` less the telemetry (job, slot)s not yet whole: a slot is judged once every node
    of its job there (its membership spans the slot) with a sample in `samples` has delivered
    one at or after the slot's start (its newest, whatever job it belongs to: a spool is
    delivered in order), or once the slot ended `rules.complete_s` before `now` (a node that
    stopped reporting does not hold its job for ever).

    Nodes flush their spools every 30 minutes, each at its own minute: the newest half hour
    of a job holds the samples of whichever nodes flushed since, and a leaf switch's
    congestion judged among them made the early flusher a suspect (one mover of the 8 present
    is not job-wide). A slot held back is neither outlying nor in line: it is not in the
    frame, and since every later slot of the job is held back too, it ends no run and joins
    none; the next pass judges it whole."""
    if rules.complete_s <= 0 or obs.empty or samples is None or samples.empty:
        return obs
    tel = (obs["source"] == TELEMETRY).to_numpy()
    times = utc(samples["time"])
    now_ns = (times.max() if now is None else utc(pd.Series([now])).iloc[0]).value
    slot_ns = rules.slot_s * 10**9
    start = obs["slot"].to_numpy(dtype="int64") * slot_ns
    recent = tel & (start + slot_ns > now_ns - rules.complete_s * 10**9)
    if not recent.any():
        return obs
    inside = (times.to_numpy(dtype="int64") >= now_ns - rules.lookback_s * 10**9)
    mark = (times[inside].groupby(samples["node"].astype(str).to_numpy()[inside]).max()
            .astype("int64"))
    ask = obs.loc[recent, ["job_id", "slot"]].drop_duplicates()
    m = membership[["job_id", "node"]].assign(start=utc(membership["start"]).astype("int64"),
                                              end=utc(membership["end"]))
    m = m.assign(end=m["end"].astype("int64").where(m["end"].notna(), np.iinfo("int64").max))
    pairs = ask.merge(m, on="job_id", how="inner")
    at = pairs["slot"].to_numpy(dtype="int64") * slot_ns
    spans = (pairs["start"].to_numpy() < at + slot_ns) & (pairs["end"].to_numpy() > at)
    pairs, at = pairs[spans], at[spans]
    # a member with no sample in the frame at all is none of its slots' (a node with no
    # telemetry, one down since before the window): it holds nothing back
    seen = pairs["node"].astype(str).map(mark).fillna(np.iinfo("int64").max).to_numpy()
    short = pairs.loc[seen < at, ["job_id", "slot"]].drop_duplicates()
    if short.empty:
        return obs
    held = obs[["job_id", "slot"]].merge(short.assign(_held=True), on=["job_id", "slot"],
                                         how="left")["_held"].notna().to_numpy()
    return obs[~(held & tel)].reset_index(drop=True)


def _levelled(obs: pd.DataFrame, raw: pd.DataFrame, rules: Rules,
              suspects: Collection[str] = ()) -> pd.DataFrame:
    """The `levelled` metrics' rows judged again with each node's value over its own level in
    the job (its role), the line and median given back in the node's units; a row STRONG
    lines past its peers as it is keeps that judgement. A suspect's level is 1 (judged against
    its peers' levelled median as it is): its share in this window's first slots is the
    fault's, and before the onset that made it a suspect it was level with its peers."""
    names = [m for m, r in rules.metrics.items() if r.levelled]
    lev = raw["metric"].isin(names).to_numpy()
    if not lev.any():
        return raw
    key = ["job_id", "node", "group", "metric"]
    r = raw[lev]
    with np.errstate(divide="ignore", invalid="ignore"):
        share = r["value"] / r["median"].where(r["median"] > 0)
    first = (r.assign(share=share).sort_values("slot").groupby(key, sort=False)
             .head(LEVEL_SLOTS).groupby(key, sort=False)["share"].median())
    sign = pd.Series({m: rules.metrics[m].sign for m in names})
    lighter = sign.reindex(first.index.get_level_values("metric")).to_numpy()
    # only the lighter side of 1: LOW metrics min(share, 1), HIGH ones max(share, 1)
    level = pd.Series(np.where(lighter < 0, np.minimum(first, 1.0), np.maximum(first, 1.0)),
                      index=first.index, name="level")
    level = level[np.isfinite(level.to_numpy()) & (level.to_numpy() > 0)]
    if len(suspects):  # a suspect's level is its peers' (1): its onset is behind it
        level = level.where(~level.index.get_level_values("node").isin(set(suspects)), 1.0)
    o = obs[obs["metric"].isin(names)].join(level, on=key, how="inner")
    if o.empty:
        return raw
    adj = judge_slots(o.assign(value=o["value"] / o["level"]).drop(columns="level"), rules)
    adj = adj.join(level, on=key).set_index(key + ["slot"])
    was = r.set_index(key + ["slot"])
    adj = adj[adj.index.isin(was.index)]
    alone = r[~was.index.isin(adj.index)]  # no level (a peers' median of 0): as they were
    was = was.loc[adj.index]
    out = adj.assign(value=was["value"], median=was["median"], line=adj["line"] * adj["level"])
    out = out.drop(columns="level")
    keep = (was["outlier"] & (was["deviation"] >= STRONG * rules.k) & ~adj["outlier"])
    out.loc[keep.to_numpy()] = was.loc[keep.to_numpy(), out.columns].to_numpy()
    out = out.reset_index()[raw.columns].astype(raw.dtypes.to_dict())
    parts = [f for f in (raw[~lev], alone) if len(f)]
    return pd.concat([*parts, out], ignore_index=True) if parts else out


def detect_frame(samples: pd.DataFrame, membership: pd.DataFrame,
                 steps: pd.DataFrame | None, cfg: Any,
                 suspects: Collection[str] = (), now: Any = None) -> list[SuspectEvidence]:
    """Suspects from telemetry samples (node, time, metric, value, component), job membership
    (job_id, node, start, end[, gpu_model][, stage]) and per-rank step times (job_id, rank,
    node, stage, step, seconds, time) or None. `cfg`: a Config, or Rules. `suspects`: the nodes
    already suspect (an open episode), whose onset an earlier window saw (find_runs). `now`:
    the pass's time (None: the newest sample's), which telemetry slots are whole (`delivered`)."""
    rules = cfg if isinstance(cfg, Rules) else Rules.from_config(cfg)
    return evidence_from_runs(find_runs(judged(samples, membership, steps, rules, suspects,
                                               now), rules, suspects))
