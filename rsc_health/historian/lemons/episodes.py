"""Episodes, and a node's episodes judged against its peer group's own rate.

An episode is one fault as the node lived it: the retries, repeated XIDs, the drain, the
ticket and the DOWN that one bad GPU causes in an evening are one episode, whatever source
each came from (`fault_episodes`). A node's events (rows of node, time) chain into one
episode until `gap` after the episode's first event (a fault that keeps coming back is an
episode per `gap`, not one endless chain); a repair ticket joins the episode it repairs.

The fleet-rate rule (`rate_test`) asks of every node: is its episode count in the window
unlikely at its peer group's own rate? The group's rate is its episodes per node-day of
exposure, leaving the node itself out (one lemon in a small group would otherwise raise the
bar it is judged by); the node's expectation is that rate times its own exposure, and its
p-value the Poisson upper tail P(X >= episodes). It is asked twice: of every episode, and of
the repaired ones (a ticket was opened): repairs are rarer than faults, so a node repaired
again and again stands out where its plain count would not. Testing every node of a fleet,
some would pass any fixed p by chance, so the p-values of every node and both questions are
adjusted together by Benjamini-Hochberg: a flagged node is unusual among all the nodes of
the fleet tested (not only its own group: 3 outages against 0.08 expected is rare in a
system of 200 nodes and ordinary in a fleet of 5,000), and a noisy system (whose every node
fails often) is judged by its own rate, not by a quieter one's.

Fleet-wide incident days (`incident_days`) are left out before the rate is taken: a day on
which more of a group's nodes began an episode than its rate makes plausible (a Poisson upper
tail below `alpha` divided by the days tested) is a shared cause (power, cooling, a switch, a
bad driver roll-out), not many lemons at once.

Pure pandas and scipy: every input is a frame the caller read from the database.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import false_discovery_control, poisson

# Pseudo-episodes added to a group's count before its rate is taken: a group in which nobody
# else failed still has a rate above zero, so one episode alone is never infinitely unlikely.
PRIOR_EPISODES = 0.5


def episode_starts(events: pd.DataFrame, gap: pd.Timedelta) -> pd.DataFrame:
    """The first row of each episode of `events` (columns node, time, ...): a node's row more
    than `gap` after the first row of its episode begins a new one (`_begins`)."""
    if events.empty:
        return events.iloc[0:0]
    ordered = events.assign(time=pd.to_datetime(events["time"])).sort_values(
        ["node", "time"], kind="stable"
    )
    return ordered[_begins(ordered["node"].to_numpy(), ordered["time"].to_numpy(), gap)]


def _begins(node: np.ndarray, t: np.ndarray, gap: pd.Timedelta) -> np.ndarray:
    """Which rows (sorted by node, then time) begin an episode: a node's first row, and each
    row more than `gap` after the first row of the episode before it. An episode lasts at
    most `gap` from its first event: the retries of one evening are one, but a fault that
    comes back every day is an episode a day, not one endless chain (chaining each event to
    the one before made a GPU with an XID every 23 hours one fault for ever)."""
    g = gap.to_timedelta64()
    new = np.zeros(len(t), dtype=bool)
    if not len(t):
        return new
    bounds = np.flatnonzero(np.r_[True, node[1:] != node[:-1], True])
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):  # a step per episode, not per row
        i = a
        while i < b:
            new[i] = True
            i = a + int(np.searchsorted(t[a:b], t[i] + g, side="right"))
    return new


def count_episodes(events: pd.DataFrame, gap: pd.Timedelta) -> pd.Series:
    """node -> number of episodes in `events` (float, as the other feature series)."""
    return episode_starts(events, gap).groupby("node").size().astype("float64")


def incident_days(
    starts: pd.DataFrame, exposure: pd.DataFrame, alpha: float
) -> pd.DataFrame:
    """Days on which a peer group had more nodes beginning an episode than chance allows.

    `starts`: episode starts (node, time, group); `exposure`: node, group, days (node-days in
    the window). Returns group, day, nodes (that began an episode), expected. The group's
    daily expectation is its rate (from the days not judged incidents: two passes) times its
    nodes; a day is an incident when P(X >= nodes) < alpha / days in the window."""
    cols = ["group", "day", "nodes", "expected"]
    if starts.empty or alpha <= 0:
        return pd.DataFrame(columns=cols)
    daily = (
        starts.assign(day=pd.to_datetime(starts["time"]).dt.floor("D"))
        .groupby(["group", "day"])["node"].nunique().rename("nodes").reset_index()
    )
    per_group = exposure.groupby("group").agg(node_days=("days", "sum"), size=("node", "size"))
    span_days = max(float(exposure["days"].max()), 1.0) if not exposure.empty else 1.0
    daily = daily.join(per_group, on="group")
    daily = daily[daily["node_days"] > 0]
    incident = pd.Series(False, index=daily.index)
    for _ in range(2):  # the rate without the incidents found in the first pass
        quiet = daily[~incident].groupby("group")["nodes"].sum()
        rate = (quiet.reindex(daily["group"]).fillna(0).to_numpy() + PRIOR_EPISODES) / (
            daily["node_days"].to_numpy()
        )
        expected = rate * daily["size"].to_numpy()
        p = poisson.sf(daily["nodes"].to_numpy() - 1, expected)
        incident = pd.Series(p < alpha / span_days, index=daily.index)
    daily["expected"] = expected
    return daily.loc[incident.to_numpy(), cols].reset_index(drop=True)


def fault_episodes(rows: pd.DataFrame, tickets: pd.DataFrame, gap: pd.Timedelta,
                   lag: pd.Timedelta) -> pd.DataFrame:
    """One row per episode, whatever the sources: node, time (its first event), own, repaired.

    `rows` (node, time, own): the node's fault events (XIDs, failed checks, outages), chained
    by `gap`; `own` False for an outage that was not the node's own (maintenance, fleet-wide),
    kept so that the ticket of that outage does not become a fault of its own. An episode is
    the node's own when any of its events is. `tickets` (node, time, own: False for a planned
    one): a repair ticket opened at most `lag` after the last event of the node's latest
    episode, or at most `gap` before an episode begins (opened, then the node drained for
    it), is that episode's repair (it is `repaired`); a ticket with no episode by it
    (a site that imports tickets only, or a fault no other source saw) is an episode of its
    own, tickets within `gap` of each other one. The same fault imported as an outage and
    again as a ticket is one episode, not two."""
    cols = ["node", "time", "own", "repaired"]
    # one dtype for node and time in both, as merge_asof requires
    r = rows[["node", "time", "own"]].astype({"node": str}).assign(
        time=pd.to_datetime(rows["time"]).astype("datetime64[ns]"))
    tk = tickets[["node", "time", "own"]].astype({"node": str}).assign(
        time=pd.to_datetime(tickets["time"]).astype("datetime64[ns]"))
    parts = []
    joined = np.zeros(len(tk), dtype=bool)
    if not r.empty:
        eps = _chain(r, gap)
        if not tk.empty:
            tk = tk.sort_values("time", kind="stable").reset_index(drop=True)
            ends = eps[["node", "time", "last"]].rename(columns={"time": "start"})
            hit = pd.merge_asof(tk, ends.sort_values("start", kind="stable"),
                                left_on="time", right_on="start", by="node",
                                direction="backward")
            joined = (hit["start"].notna() & (hit["time"] - hit["last"] <= lag)).to_numpy()
            # a ticket opened just before the drain it asked for (within `gap`) is its too
            ahead = pd.merge_asof(tk, ends.sort_values("start", kind="stable"),
                                  left_on="time", right_on="start", by="node",
                                  direction="forward", tolerance=gap)
            early = ~joined & ahead["start"].notna().to_numpy()
            hit.loc[early, "start"] = ahead.loc[early, "start"]
            joined = joined | early
            repaired = pd.MultiIndex.from_frame(hit.loc[joined, ["node", "start"]])
            eps["repaired"] = pd.MultiIndex.from_arrays([eps["node"], eps["time"]]).isin(
                repaired)
        parts.append(eps[cols])
    alone = tk[~joined] if len(tk) else tk
    if not alone.empty:
        parts.append(_chain(alone, gap).assign(repaired=True)[cols])
    if not parts:
        return pd.DataFrame({"node": pd.Series(dtype=object),
                             "time": pd.Series(dtype="datetime64[ns]"),
                             "own": pd.Series(dtype=bool), "repaired": pd.Series(dtype=bool)})
    return pd.concat(parts, ignore_index=True).sort_values(["node", "time"], kind="stable")


def _chain(rows: pd.DataFrame, gap: pd.Timedelta) -> pd.DataFrame:
    """Episodes of rows (node, time, own): node, time, last, own, repaired (False)."""
    ordered = rows.sort_values(["node", "time"], kind="stable")
    new = _begins(ordered["node"].to_numpy(), ordered["time"].to_numpy(), gap)
    out = ordered.assign(_e=np.cumsum(new)).groupby("_e", sort=False).agg(
        node=("node", "first"), time=("time", "min"), last=("time", "max"),
        own=("own", "any"))
    return out.assign(repaired=False).reset_index(drop=True)


def rate_test(counts: dict[str, pd.Series], exposure: pd.DataFrame) -> pd.DataFrame:
    """Per node of `exposure` (node, group, days), for each stream of `counts` (name -> node ->
    count: every episode, and the repaired ones): the expectation at its group's rate without
    it (NaN for a node alone in its group) and the Poisson upper-tail p. The p-values of every
    node and stream are adjusted together by Benjamini-Hochberg (scipy's
    false_discovery_control): the family is the whole fleet tested, not one group, so a node
    flagged is unlikely by chance among every node of every system; a stream nobody has (no
    tickets imported) is not tested. A node's q is its smallest; `by` says which stream gave
    it.

    Columns: group, days, then per stream <name>, <name>_expected, <name>_p; then q, by."""
    frame = exposure.set_index("node")[["group", "days"]].copy()
    ps, names = [], []
    for name, series in counts.items():
        n = series.reindex(frame.index).fillna(0.0)
        frame[name] = n.to_numpy()
        totals = frame.groupby("group")[[name, "days"]].transform("sum")
        others = (totals[name] - frame[name]).to_numpy()
        other_days = (totals["days"] - frame["days"]).to_numpy()
        # A node without peers (alone in its group) has no rate to be judged against:
        # expected NaN, p 1.
        alone = other_days <= 0
        rate = (others + PRIOR_EPISODES) / np.where(alone, np.nan, other_days)
        frame[f"{name}_expected"] = rate * frame["days"].to_numpy()
        frame[f"{name}_p"] = np.where(
            alone, 1.0, poisson.sf(frame[name].to_numpy() - 1, frame[f"{name}_expected"]))
        if frame[name].sum() > 0:
            ps.append(frame[f"{name}_p"].to_numpy())
            names.append(name)
    frame["q"] = 1.0
    frame["by"] = next(iter(counts), "")
    if ps:
        q = false_discovery_control(np.concatenate(ps)).reshape(len(ps), -1)
        best = q.argmin(axis=0)
        frame["q"] = q[best, np.arange(q.shape[1])]
        frame["by"] = np.asarray(names, dtype=object)[best]
    return frame
