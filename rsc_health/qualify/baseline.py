"""A fleet baseline imported from elsewhere: SuperBench's per-metric fleet averages (e.g.
../shared/data/qualify/fleet-baseline/ndv4-a100-baseline.json: 1,939 Azure NDv4 nodes), used as
the median until the fleet has min_peers passes of its own. Metric names are SuperBench's, as our
plug-ins name theirs. Per-device metrics are averaged over devices in that dataset, so a baseline
for `ib-loopback/ib_write_8388608_ib3_bw` also serves any HCA name whose own key is missing."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path

from rsc_health.qualify.outcome import Metric

MAX_BYTES = 16 << 20


class Baseline:
    def __init__(self, values: dict[str, float], source: str = ""):
        self.values = values
        self.source = source

    @classmethod
    def load(cls, path: Path) -> Baseline:
        """The baseline at `path`, or OSError / ValueError saying why not. It judges a young
        fleet's nodes, so like the site config that names it it must be root's (or this
        user's), writable by no one else, on a path no one else can swap (durable's rules),
        and a regular file of at most MAX_BYTES (a FIFO would hang the run)."""
        from rsc_health.durable import trust_refusal

        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"{path}: not a regular file")
            why = trust_refusal(st, path)
            if why:
                raise ValueError(f"{path}: {why} (numbers someone else could write would "
                                 "pass slow nodes: chown root and chmod go-w it and the "
                                 "directories above it)")
            data = fh.read(MAX_BYTES + 1)
        if len(data) > MAX_BYTES:
            raise ValueError(f"{path}: larger than {MAX_BYTES} bytes")
        try:
            doc = json.loads(data)
        except RecursionError:  # what the caller says of any file that is not JSON
            raise ValueError(f"{path}: not JSON: nested too deep") from None
        if not isinstance(doc, dict):
            raise ValueError(f"{path}: a baseline is a JSON object of metric: value")
        values = {}
        for key, value in doc.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value) and value > 0 and not key.endswith("/return_code"):
                values[str(key)] = float(value)
        return cls(values, str(path))

    def get(self, metric: Metric) -> float | None:
        if metric.name in self.values:
            return self.values[metric.name]
        # A per-device name the baseline lacks (mlx5_4 where it has ib0..ib7): the mean over
        # the devices it has for the same metric.
        token = f"_{metric.index}_"
        if metric.index and token in metric.name:
            before, after = metric.name.rsplit(token, 1)
            pattern = re.compile(re.escape(before) + r"_[A-Za-z0-9]+(?:_\d+)?_"
                                 + re.escape(after) + "$")
            found = [v for k, v in self.values.items() if pattern.match(k)]
            if found:
                return sum(found) / len(found)
        return None
