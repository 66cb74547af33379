"""The report's folding of repeated actions keeps the order of what happened, and its links
never carry a node name or a configured URL into the page unescaped."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pandas as pd

from rsc_health.report.fleet import fold_repeats
from rsc_health.report.links import Links

T = datetime(2026, 11, 20, 11, 0)
R = "rsc_health:now:xid79:gpu3 XID 79 GPU has fallen off the bus"


def _actions(rows):
    return pd.DataFrame(rows, columns=["time", "node", "action", "reason", "job_id"])


def test_a_resume_between_two_runs_of_would_drain_keeps_them_two_intervals():
    m = timedelta(minutes=5)
    frame = _actions([
        (T, "gpu1", "would_drain", R, None),
        (T + m, "gpu2", "would_drain", R, math.nan),  # another node between: no split
        (T + m, "gpu1", "would_drain", R, math.nan),  # None and NaN job ids: the same
        (T + 2 * m, "gpu1", "resume", "", None),
        (T + 3 * m, "gpu1", "would_drain", R, None),
        (T + 4 * m, "gpu1", "would_drain", R + " (+1 more)", None),  # another reason
        (T + 5 * m, "gpu1", "requeue", R, "4242"),
        (T + 5 * m, "gpu1", "requeue", R, "4243"),  # another job: its own row
    ])
    folded = fold_repeats(frame)
    assert [(r.node, r.action, r.count, r.time, r.last_seen) for r in folded.itertuples()] == [
        ("gpu1", "would_drain", 2, T, T + m),
        ("gpu2", "would_drain", 1, T + m, T + m),
        ("gpu1", "resume", 1, T + 2 * m, T + 2 * m),
        ("gpu1", "would_drain", 1, T + 3 * m, T + 3 * m),
        ("gpu1", "would_drain", 1, T + 4 * m, T + 4 * m),
        ("gpu1", "requeue", 1, T + 5 * m, T + 5 * m),
        ("gpu1", "requeue", 1, T + 5 * m, T + 5 * m),
    ]
    assert fold_repeats(_actions([])).empty


def test_links_escape_hostile_node_names_and_refuse_scripts():
    links = Links.from_config({"node_url": "https://g.example/d/n?var-node={node}",
                               "dashboard_url": "javascript:alert(1)"})
    assert links.node('gpu"1&x=<b>') == "https://g.example/d/n?var-node=gpu%221%26x%3D%3Cb%3E"
    assert links.dashboard() == ""  # not http(s) or a path: no link
    assert Links.from_config({}).of("gpu1") == {"story": "healthctl node gpu1",
                                                "node_url": "", "dashboard_url": ""}
    assert Links.from_config({"node_url": "/grafana/d/n?node={node}"}).node("a b") == \
        "/grafana/d/n?node=a%20b"


def test_a_story_pasted_into_a_shell_runs_nothing_a_node_name_holds(tmp_path):
    """The report shows each node's story, `healthctl node NODE`, for an operator to copy
    into a shell on the management host. Node names reach the historian from every node's
    deliveries and `ingest checks` files, which refuse spaces and control characters but
    take `;`, `$(...)` and backquotes: a node's root could plant a check record for a node
    named `gpu1;touch${IFS}FILE` and the pasted story ran the command as the operator.
    Now the name is quoted for the shell: the story runs `healthctl node` with the name as
    one argument and nothing else."""
    import subprocess

    planted = tmp_path / "pwned"
    for name in (f"gpu1;touch${{IFS}}{planted}", f"gpu2$(touch${{IFS}}{planted})",
                 f"gpu3`touch${{IFS}}{planted}`", "gpu4'&&touch'", "gpu-ok_5.a"):
        story = Links.from_config({}).of(name)["story"]
        # `healthctl` here prints its arguments, one a line, as the real one would take them
        done = subprocess.run(["sh", "-c", 'healthctl() { printf "%s\\n" "$@"; }\n' + story],
                              cwd=tmp_path, capture_output=True, text=True, timeout=10)
        assert done.stdout.splitlines() == ["node", name], (story, done)
        assert not planted.exists(), story
    assert Links.from_config({}).of("gpu-ok_5.a")["story"] == "healthctl node gpu-ok_5.a"
