"""Hand-built ReportData: small, every section filled, values in the paper's ranges."""

from __future__ import annotations

from datetime import datetime, timedelta

import pandas as pd
import pytest

from rsc_health.historian.lemons.features import PAPER_FEATURES
from rsc_health.report.data import ReportData

AS_OF = datetime(2024, 6, 30)


def build_report_data(as_of: datetime = AS_OF) -> ReportData:
    days = pd.date_range(as_of - timedelta(days=59), as_of, freq="D")
    rolling = pd.DataFrame(
        [
            {"time": d, "mode": mode, "rate_per_1000_node_days": base + (i % 7) * 0.3}
            for i, d in enumerate(days)
            for mode, base in (("xid", 2.0), ("infiniband", 1.0), ("mount", 0.5))
        ]
    )
    sizes = [8, 16, 32, 64, 128, 256, 512, 1024]
    mttf = pd.DataFrame(
        {
            "gpus": sizes,
            "mttf_hours": [1100.0, 600.0, 290.0, 150.0, 70.0, 33.0, 16.0, 7.9],
            "ci_low_hours": [800.0, 450.0, 220.0, 110.0, 55.0, 26.0, 12.0, 6.0],
            "ci_high_hours": [1600.0, 800.0, 380.0, 200.0, 90.0, 42.0, 21.0, 10.5],
            "projected_hours": [24 * 8 / (g * 6.5e-3) for g in sizes],
        }
    )
    features = pd.DataFrame(
        [
            {"node": f"gpu{n:03d}", **{f: (n * (k + 1)) % 5 for k, f in enumerate(PAPER_FEATURES)}}
            for n in range(40)
        ]
    )
    features["single_node_node_failure_rate"] = features["single_node_node_fails"] / 20.0
    lemons = pd.DataFrame(
        [
            {
                "node": "gpu007",
                "rules": ["xid_cnt>=3", "out_count>=2"],
                "evidence": ["xid_cnt=4 >= 3 (xid79, xid48)", "out_count=3 >= 2"],
            },
            {
                "node": "gpu013",
                "rules": ["single_node_node_fails>=2"],
                "evidence": ["single_node_node_fails=3 >= 2 (jobs 101, 102, 109)"],
            },
        ]
    )
    actions = pd.DataFrame(
        [
            {"time": as_of - timedelta(hours=5), "node": "gpu007", "action": "drain",
             "reason": "rsc_health:now:xid79:GPU fell off the bus", "job_id": "101"},
            {"time": as_of - timedelta(hours=2), "node": "gpu021", "action": "resume",
             "reason": "rsc_health:job:ecc_dbe:cleared", "job_id": None},
        ]
    )
    return ReportData(
        as_of=as_of,
        outcomes=pd.DataFrame(
            {
                "state": ["COMPLETED", "FAILED", "CANCELLED", "PREEMPTED", "NODE_FAIL", "TIMEOUT"],
                "jobs": [6000, 2400, 1000, 1000, 10, 60],
                "gpu_hours": [5.0e5, 1.5e5, 1.0e5, 8.0e4, 9.0e4, 1.0e4],
            }
        ),
        causes=pd.DataFrame(
            {
                "cause": ["infiniband", "mount", "ecc", "pcie", "xid", "unattributed"],
                "failures": [40, 30, 20, 15, 10, 60],
                "rate_per_gpu_hour": [4e-6, 3e-6, 2e-6, 1.5e-6, 1e-6, 6e-6],
            }
        ),
        rolling=rolling,
        deployments=pd.DataFrame(
            {"check": ["nvlink"], "time": [as_of - timedelta(days=20)]}
        ),
        mttf=mttf,
        goodput=pd.DataFrame(
            {
                "gpus": sizes,
                "failure_gpu_hours": [10.0, 20, 40, 80, 200, 500, 1500, 4000],
                "preemption_gpu_hours": [50.0, 60, 40, 30, 40, 80, 200, 300],
            }
        ),
        ettr=pd.DataFrame(
            {
                "run": [f"run{i}" for i in range(6)],
                "gpus": [128, 256, 512, 1024, 2048, 4096],
                "measured": [0.93, 0.92, 0.9, 0.88, 0.9, 0.87],
                "ci_low": [0.9, 0.89, 0.86, 0.84, 0.86, 0.82],
                "ci_high": [0.96, 0.95, 0.94, 0.92, 0.94, 0.92],
                "expected": [0.95, 0.94, 0.92, 0.9, 0.86, 0.8],
            }
        ),
        features=features,
        lemons=lemons,
        actions=actions,
        guard={"state": "armed", "detail": "2 of 40 nodes drained by rsc-health (limit 10%)"},
        reliability=pd.DataFrame(
            [{"period": f"2024-0{m}", "group": g, "failures": f, "episodes": f - 1,
              "nodes_failed": f - 2, "node_days": 600.0, "hours": 720.0,
              "system_mtbf_h": 720.0 / f, "hours_per_failure": 720.0 / f,
              "node_mtbf_h": 600 * 24.0 / f, "repair_p50_h": 2.0 + m, "repair_p90_h": 30.0 + m,
              "repair_mean_h": 8.0, "reasons": {"GPU fell off the bus": f - 2, "DBE": 2}}
             for m in (4, 5, 6) for g, f in (("c/a", 6 + m), ("c/b", 4))]),
        triage=pd.DataFrame({"label": ["host", "user", "unknown"], "jobs": [12, 40, 7],
                             "nodes": [["gpu007 (5)", "gpu013 (3)"], [], []]}),
    )


@pytest.fixture
def report_data() -> ReportData:
    return build_report_data()
