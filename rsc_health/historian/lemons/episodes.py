"""Episodes, and a node's episodes judged against its peer group's own rate.

An episode is one fault as the node lived it: the retries, repeated XIDs, the drain, the
ticket and the DOWN that one bad GPU causes in an evening are one episode. A node's events
(rows of node, time) chain into one episode while each is at most `gap` after the one before.

The fleet-rate rule (`rate_test`) asks of every node: is its episode count in the window
unlikely at its peer group's own rate? The group's rate is its episodes per node-day of
exposure, leaving the node itself out (one lemon in a small group would otherwise raise the
bar it is judged by); the node's expectation is that rate times its own exposure, and its
p-value the Poisson upper tail P(X >= episodes). Testing every node of a fleet, some would
pass any fixed p by chance, so the p-values are adjusted by Benjamini-Hochberg within the
group: a flagged node is unusual among all the nodes tested, and a noisy system (whose
every node fails often) is judged by its own rate, not by a quieter one's.

Fleet-wide incident days (`incident_days`) are left out before the rate is taken: a day on
which more of a group's nodes began an episode than its rate makes plausible (a Poisson upper
tail below `alpha` divided by the days tested) is a shared cause (power, cooling, a switch, a
bad driver roll-out), not many lemons at once.

Pure pandas and scipy: every input is a frame the caller read from the database.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import poisson

# Pseudo-episodes added to a group's count before its rate is taken: a group in which nobody
# else failed still has a rate above zero, so one episode alone is never infinitely unlikely.
PRIOR_EPISODES = 0.5


def episode_starts(events: pd.DataFrame, gap: pd.Timedelta) -> pd.DataFrame:
    """The first row of each episode of `events` (columns node, time, ...): a node's row more
    than `gap` after its previous row begins a new episode."""
    if events.empty:
        return events.iloc[0:0]
    ordered = events.assign(time=pd.to_datetime(events["time"])).sort_values(
        ["node", "time"], kind="stable"
    )
    node = ordered["node"].to_numpy()
    t = ordered["time"].to_numpy()
    new = np.ones(len(ordered), dtype=bool)
    new[1:] = (node[1:] != node[:-1]) | (t[1:] - t[:-1] > gap.to_timedelta64())
    return ordered[new]


def count_episodes(events: pd.DataFrame, gap: pd.Timedelta) -> pd.Series:
    """node -> number of episodes in `events` (float, as the other feature series)."""
    return episode_starts(events, gap).groupby("node").size().astype("float64")


def benjamini_hochberg(p: np.ndarray) -> np.ndarray:
    """BH-adjusted p-values (q-values) of `p`, in the same order."""
    n = len(p)
    if n == 0:
        return p
    order = np.argsort(p)
    ranked = p[order] * n / np.arange(1, n + 1)
    q = np.minimum.accumulate(ranked[::-1])[::-1]
    out = np.empty(n)
    out[order] = np.minimum(q, 1.0)
    return out


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


def rate_test(episodes: pd.Series, exposure: pd.DataFrame) -> pd.DataFrame:
    """Per node of `exposure` (node, group, days): its episodes, the expectation at its group's
    rate without it (NaN for a node alone in its group), the Poisson upper-tail p and the BH q
    within the group.

    Columns: group, days, episodes, expected, p, q."""
    frame = exposure.set_index("node")[["group", "days"]].copy()
    frame["episodes"] = episodes.reindex(frame.index).fillna(0.0).to_numpy()
    totals = frame.groupby("group")[["episodes", "days"]].transform("sum")
    others = (totals["episodes"] - frame["episodes"]).to_numpy()
    other_days = (totals["days"] - frame["days"]).to_numpy()
    # A node without peers (alone in its group) has no rate to be judged against: expected
    # NaN, p 1.
    alone = other_days <= 0
    rate = (others + PRIOR_EPISODES) / np.where(alone, np.nan, other_days)
    frame["expected"] = rate * frame["days"].to_numpy()
    frame["p"] = np.where(
        alone, 1.0, poisson.sf(frame["episodes"].to_numpy() - 1, frame["expected"].to_numpy())
    )
    frame["q"] = 1.0
    for _, idx in frame.groupby("group").indices.items():
        frame.iloc[idx, frame.columns.get_loc("q")] = benjamini_hochberg(
            frame["p"].to_numpy()[idx]
        )
    return frame
