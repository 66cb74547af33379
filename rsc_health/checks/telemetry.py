"""Telemetry: what a GPU and its links are doing, sampled each sweep, judged only to warn.

NVML (read with the other GPU families' answers, but only when this family runs: a device's
`telemetry` block, rsc_health/collect/gpu.py) gives per GPU its SM and memory clocks and their
maxima, power draw and the enforced limit, utilization, the cumulative violation times of
nvmlDeviceGetViolationStatus (power, thermal, sync boost, board limit, reliability) and the
per-reason clock-event times (SW power cap, HW slowdown, SW/HW thermal, HW power brake), the
NVLink data KiB sent and received over all links (NVLINK_THROUGHPUT_DATA_TX/RX) and the row
remapper's histogram of banks by spare rows left; with the PCIe link, replay counter,
temperature, remapped rows and NVLink error counters every GPU family reads.
The HCAs give `port_xmit_wait` (ticks a port had data and could not send: congestion), the
data counters (`port_xmit_data`, `port_rcv_data`: octets / 4) and the error counters the
infiniband family judges but discards under /sys/class/infiniband/<hca>/ports/<n>/counters/,
and the port's `rate`. ib_error_rate sums the link's own physical errors (IB_ERRORS) only.

Cumulative counters are kept between runs as every family keeps its own (`counters`, saved
in counters.json with the time of the read): a rate is the increase over the interval since
the last run that sampled them. None on a first run, after a reboot or when the interval is
outside [telemetry] min_interval_s..max_interval_s; a counter that went down (a driver reload,
a wrap) counts from zero, never negative.

`check` is pure: it turns the state into the node-level sample of the shared vocabulary
(`model.Metric`, one value per metric with the worst component), carried by an OK finding
whose data the node path spools as one `telemetry` record, and warns on what a healthy GPU
does not do: HW slowdown, HW/SW thermal or HW power-brake slowdown for more than
`hw_throttle_warn_frac` of the interval (gpu_hw_throttle), a busy GPU's PCIe link below its
maximum (gpu_pcie_slow), NVLink errors (CRC, replay, recovery) faster than [telemetry]
warn_above.nvlink_error_rate (gpu_nvlink_errors), memory banks with low or no remap
availability beyond warn_above.remap_low_banks (gpu_remap_low). A pending remap or IB error
counters rising are the remap and infiniband families' to act on; here they are figures only.
Throttling never drains, and the SW power cap never warns by itself:
a healthy H200 at full load spends a third of its time there
(tests/fixtures/real/h200-vm-2026-11-26/nvml-telemetry-4hz.jsonl.gz). NVML fields it answers
NOT_SUPPORTED or NO_PERMISSION for are absent from the sample, not checker errors.
"""

from __future__ import annotations

import time

from rsc_health.checks._finding import ok, readable_gpus, warn
from rsc_health.checks.infiniband import ERROR_COUNTERS, saturated
from rsc_health.collect import ibports
from rsc_health.collect.counters import plausible, replay_clock
from rsc_health.collect.gpu import TELEMETRY_KEY, val
from rsc_health.collect.sysfs import parse_count
from rsc_health.model import Finding, Metric

TYPE_CHECKING = False  # typing's, without importing typing: every job start loads this
if TYPE_CHECKING:
    from _typeshed import StrPath  # str | os.PathLike[str]

FAMILY = "telemetry"
# The error counters that count this link's own physical errors (kernel
# Documentation/ABI/stable/sysfs-class-infiniband; docs/failslow.md): minor errors on its
# lanes (on HDR/NDR those left after FEC), link error recoveries, link downs, and bursts of
# local physical errors past LocalPhyErrors. Their sum per second is ib_error_rate.
IB_ERRORS = ("symbol_error", "link_error_recovery", "link_downed",
             "local_link_integrity_errors")
# The infiniband family's other error counters but transmit discards (congestion, which
# port_xmit_wait measures): receive errors mix local physical errors with buffer overruns and
# malformed packets, remote physical errors are packets a link elsewhere marked bad, and
# overruns are load or configuration; healthy NDR ports count all three under load. Each
# port's figures keep their rates; ib_error_rate does not sum them.
IB_LOAD_ERRORS = tuple(c for c in ERROR_COUNTERS
                       if c not in IB_ERRORS and c != "port_xmit_discards")
IB_COUNTERS = ("port_xmit_wait", "port_xmit_data", "port_rcv_data", *IB_ERRORS,
               *IB_LOAD_ERRORS)
_PORTS = "sys/class/infiniband/*/ports/*"
READS = (f"{_PORTS}/rate", f"{_PORTS}/link_layer",
         *(f"{_PORTS}/counters/{c}" for c in IB_COUNTERS))
# The clock-event times that mean the hardware protected itself (HW slowdown, thermal, power
# brake); the violation policy "thermal" stands in where the per-reason fields are absent.
HW_EVENTS = ("hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
TIME_KEY = "tm/time_ms"
NS = 1e9
# More NVLink bytes per second (sent + received) than any GPU's links carry (NVLink 5: 1.8 TB/s
# both ways together), with room: a rate past it is a counter that jumped (a garbled read, a
# reset the driver did not show as one), not traffic, and is absent, never recorded.
NVLINK_MAX_BYTES_S = 4e12
# Past these a reading is not one: clocks in MHz (today's GPUs run under 4 GHz), the PCIe
# generation and lanes (x32 is the widest link the specification defines), and the power
# drawn against the enforced limit (a GPU can briefly overshoot it, never tenfold).
MAX_CLOCK_MHZ = 20_000
MAX_PCIE_GEN = 16
MAX_PCIE_WIDTH = 32
MAX_POWER_RATIO = 10.0
# The NVLink error counters summed per link (nvmlNvLinkErrorCounter_t), and the most links a
# GPU has (NVLink 5: 18).
NVLINK_ERRORS = ("replay", "recovery", "crc_flit", "crc_data")
NVLINK_MAX_LINKS = 64


def _prefix(g) -> str:
    """A GPU's counters' keys: by its UUID, which stays with the board when the GPUs are
    numbered again (one fell off the bus and the driver was reloaded, without a reboot);
    by its index only when NVML gave no UUID fit for a key."""
    uuid = g.uuid
    if isinstance(uuid, str) and 0 < len(uuid) <= 80 and all(
            c.isascii() and (c.isalnum() or c == "-") for c in uuid):
        return f"tm/{uuid}/"
    return f"tm/gpu{g.index}/"


def collect(root: StrPath, env=None) -> dict:
    """The HCA ports' counters and rate, and when they (and NVML, read just before) were read.
    Through the run's one reader of the ports (rsc_health.collect.ibports): the error counters,
    rate and link layer the infiniband family read this run are its answers, not read again.
    Ports not listed (their read hung: ib_hung) are none: the GPUs' sample still stands."""
    from rsc_health.checks.infiniband import parse_rate

    read = ibports.reader(root, env, ibports.port_files(READS))
    ports = []
    for hca, name, pdir in read.ports():
        counts = {}
        for c in IB_COUNTERS:
            value = parse_count(read.text(f"{pdir}/counters/{c}"))
            if value is not None:
                counts[c] = value
        ports.append({"name": f"{hca}/{name}", "hca": hca,
                      "rate_gbps": parse_rate(read.text(f"{pdir}/rate")),
                      "link_layer": read.text(f"{pdir}/link_layer"), "counters": counts})
    ibports.said(read, env, FAMILY)
    return {"time_ms": _clock_ms(root, env), "ports": ports,
            **({"after_hang": True} if ibports.after_hang(env) else {})}


def _clock_ms(root: StrPath, env) -> int:
    """Now, in ms; a snapshot's replay (`check --from`) reads when the node looked."""
    replay = str(env.cfg.get("telemetry.clock_replay_file")) if env is not None else ""
    if replay:
        value = replay_clock(root, replay).get("time_ms")
        if not isinstance(value, int) or not plausible(value):
            raise ValueError(f"{replay}: no time_ms")
        return value
    return int(time.time() * 1000)


def capture(cfg, root: StrPath, env) -> dict:
    """What a snapshot carries beyond the files: when it read the node (the rates' clock)."""
    # monotonic_ms: the clock of the counters' baselines (checks.state.time_key), which a
    # replay must measure their spans against, not the replaying host's.
    return {"telemetry_clock": {"time_ms": _clock_ms(root, None),
                                "monotonic_ms": int(time.monotonic() * 1000)}}


def _int(value) -> int | None:
    """A counter or reading NVML really answered: a non-negative int below 2**63."""
    v = val(value)
    return v if plausible(v) else None


def counters(state) -> dict[str, int]:
    """The cumulative counters this family turns into rates, and the time they were read."""
    read = state.extra.get(FAMILY)
    if read is None:
        return {}
    out = {TIME_KEY: read["time_ms"]}
    for port in read["ports"]:
        for c, v in port["counters"].items():
            out[f"tm/ib/{port['name']}/{c}"] = v
    for g, _comp in readable_gpus(state):
        out.update(_gpu_counters(g))
    return out


def _gpu_counters(g) -> dict[str, int]:
    """One GPU's cumulative counters: throttle (violation and event) times, PCIe replays and
    each NVLink's error counters summed (per link: a link that does not answer one run must
    not make the GPU's sum fall, a fall that counts as a reset and its whole history as new)."""
    p = _prefix(g)
    out: dict[str, int] = {}
    tele = g.answers.get(TELEMETRY_KEY)
    tele = tele if isinstance(tele, dict) else {}
    for group, sub in (("viol", tele.get("violation_ns")), ("event", tele.get("event_time_ns"))):
        for name, value in (sub.items() if isinstance(sub, dict) else ()):
            if _int(value) is not None:
                out[f"{p}{group}/{name}"] = value
    pcie = g.answers.get("pcie")
    replay = _int(pcie.get("replay")) if isinstance(pcie, dict) else None
    if replay is not None:
        out[f"{p}pcie_replay"] = replay
    links = [lk for lk in g.answers.get("nvlink") or [] if isinstance(lk, dict)]
    for i, lk in enumerate(links[:NVLINK_MAX_LINKS]):
        link = lk.get("link")
        link = link if type(link) is int and 0 <= link < NVLINK_MAX_LINKS else i
        errs = [_int(lk.get(c)) for c in NVLINK_ERRORS]
        if all(e is not None for e in errs):  # a link read whole, or not at all
            out[f"{p}nvlink{link}/errors"] = sum(e for e in errs if e is not None)
    kib = tele.get("nvlink_kib")
    for way in ("tx", "rx"):
        v = _int(kib.get(way)) if isinstance(kib, dict) else None
        if v is not None:
            out[f"{p}nvlink_{way}_kib"] = v
    return out


def _upto(value, most: int) -> int | None:
    """A reading NVML really answered and no GPU exceeds (0xFFFFFFFF, NVML's "not available"
    in some structs, as a maximum would make every ratio nothing)."""
    v = _int(value)
    return v if v is not None and v <= most else None


def _ratio(num, den) -> float | None:
    n, d = val(num), val(den)
    if isinstance(n, (int, float)) and isinstance(d, (int, float)) and not isinstance(n, bool) \
            and d > 0 and n >= 0:
        return n / d
    return None


def interval_s(state, tcfg: dict) -> float | None:
    """Seconds since the last run that sampled the counters, when rates may use it."""
    ms = state.deltas.get(TIME_KEY)
    if ms is None or ms == state.counters.get(TIME_KEY):
        # No baseline, or counters.deltas saw a reset: a new boot or the clock stepped back.
        return None
    secs = ms / 1000.0
    if secs <= 0 or not float(tcfg["min_interval_s"]) <= secs <= float(tcfg["max_interval_s"]):
        return None
    return secs


def gpu_sample(g, state, tcfg: dict, interval: float | None) -> dict:
    """One GPU's figures (absent when NVML did not say, or no interval for a rate)."""
    tele = g.answers.get(TELEMETRY_KEY)
    tele = tele if isinstance(tele, dict) else {}
    util = tele.get("utilization")
    busy_pct = _upto(util.get("gpu"), 100) if isinstance(util, dict) else None
    busy = busy_pct is not None and busy_pct >= float(tcfg["busy_util_pct"])
    out: dict = {"busy": busy}
    clocks, maxima = tele.get("clocks") or {}, tele.get("max_clocks") or {}
    if isinstance(clocks, dict) and isinstance(maxima, dict):
        for name in ("sm", "mem"):
            r = _ratio(clocks.get(name), _upto(maxima.get(name), MAX_CLOCK_MHZ))
            if r is not None:
                out[f"{name}_clock_ratio"] = min(r, 1.0)
    power = _ratio(tele.get("power_mw"), tele.get("enforced_power_limit_mw"))
    if power is not None and power <= MAX_POWER_RATIO:
        out["power_ratio"] = power
    temp = val(g.answers.get("temperature"))
    # NVML's temperature is an unsigned int: a negative one is a garbled answer, not a cold GPU
    # (its coolant is at room temperature or above), and would be the fleet's coldest sample.
    if isinstance(temp, (int, float)) and not isinstance(temp, bool) and 0 <= temp < 200:
        out["temp_c"] = float(temp)
    link = _pcie_link_ratio(g.answers.get("pcie"), busy)
    if link is not None:
        out["pcie_link_ratio"] = link
    out.update(_remap_figures(g.answers, tele))
    if interval is not None:
        out.update(_rates(_prefix(g), state.counters, state.deltas, interval))
    return out


def _remap_figures(answers: dict, tele: dict) -> dict:
    """Rows remapped (correctable + uncorrectable; pages retired on a GPU without a row
    remapper) and banks with low or no remap availability left; absent where NVML said
    nothing readable (a bool, a negative or a garbled count is not a count)."""
    out: dict = {}
    rows = _counts(answers.get("remapped_rows"), ("correctable", "uncorrectable"))
    if rows is None:
        rows = _counts(answers.get("retired_pages"), ("sbe", "dbe"))
    if rows is not None:
        out["remapped_rows"] = float(rows)
    low = _counts(tele.get("remap_histogram"), ("low", "none"))
    if low is not None:
        out["remap_low_banks"] = float(low)
    return out


def _counts(answer, keys: tuple[str, ...]) -> int | None:
    """The sum of an answer's counts at `keys`, or None unless every one is a real count."""
    if not isinstance(answer, dict):
        return None
    total = 0
    for key in keys:
        v = _int(answer.get(key))
        if v is None:
            return None
        total += v
    return total


def _pcie_link_ratio(pcie, busy: bool) -> float | None:
    """The PCIe link's width (and, busy, its speed) against its maximum."""
    if not isinstance(pcie, dict):
        return None
    gen, mgen = _upto(pcie.get("gen"), MAX_PCIE_GEN), _upto(pcie.get("max_gen"), MAX_PCIE_GEN)
    width = _upto(pcie.get("width"), MAX_PCIE_WIDTH)
    mwidth = _upto(pcie.get("max_width"), MAX_PCIE_WIDTH)
    if width is None or not mwidth:
        return None
    # An idle GPU drops its link to Gen1 to save power: only a busy one's speed counts.
    if busy and gen is not None and mgen:
        return min(1.0, (gen * width) / (mgen * mwidth))
    return min(1.0, width / mwidth)


def _rates(p: str, read: dict, deltas: dict, interval: float) -> dict:
    """The GPU's figures over the interval: throttled fractions (the worst hardware reason,
    the power cap) and error rates. `read`: this run's counters; one read without a rise on
    record (it did not answer the run before) leaves the worst hardware reason unknown."""
    out: dict = {}

    def frac(key: str) -> float | None:
        d = deltas.get(p + key)
        return None if d is None else min(1.0, d / (interval * NS))

    hw_keys = [f"event/{name}" for name in HW_EVENTS] + ["viol/thermal"]
    hw = {key.rpartition("/")[2]: frac(key) for key in hw_keys}
    seen = {k: v for k, v in hw.items() if v is not None}
    if seen and all(p + key not in read or p + key in deltas for key in hw_keys):
        worst = max(seen, key=lambda k: seen[k])
        out["hw_frac"], out["hw_reason"] = seen[worst], worst
    power_frac = frac("event/sw_power_cap")
    if power_frac is None:
        power_frac = frac("viol/power")
    if power_frac is not None:
        out["power_frac"] = power_frac
    d = deltas.get(p + "pcie_replay")
    if d is not None:
        out["pcie_replay_rate"] = d / interval
    # The links with a rise on record (read this run and the last): one not read is left out
    # of this run's sum, and its baseline with it (engine: a rate family's unread counters).
    links = [d for d in (deltas.get(f"{p}nvlink{i}/errors") for i in range(NVLINK_MAX_LINKS))
             if d is not None]
    if links:
        out["nvlink_error_rate"] = sum(links) / interval
    tx, rx = deltas.get(p + "nvlink_tx_kib"), deltas.get(p + "nvlink_rx_kib")
    if tx is not None and rx is not None:
        rate = (tx + rx) * 1024 / interval  # bytes per second
        if rate <= NVLINK_MAX_BYTES_S:
            out["nvlink_data_rate"] = rate
    return out


# GPU figure -> (metric, worst is the max (True) or the min (False)).
GPU_METRICS = (
    ("sm_clock_ratio", Metric.SM_CLOCK_RATIO, False),
    ("hw_frac", Metric.THROTTLE_HW_FRAC, True),
    ("power_frac", Metric.THROTTLE_POWER_FRAC, True),
    ("temp_c", Metric.GPU_TEMP_C, True),
    ("power_ratio", Metric.POWER_RATIO, True),
    ("pcie_link_ratio", Metric.PCIE_LINK_RATIO, False),
    ("pcie_replay_rate", Metric.PCIE_REPLAY_RATE, True),
    ("nvlink_error_rate", Metric.NVLINK_ERROR_RATE, True),
    ("nvlink_data_rate", Metric.NVLINK_DATA_RATE, False),
    ("remapped_rows", Metric.REMAPPED_ROWS, True),
    ("remap_low_banks", Metric.REMAP_LOW_BANKS, True),
)
# Only busy GPUs: an idle one parks its clocks and sends nothing over NVLink by design.
BUSY_ONLY = frozenset({"sm_clock_ratio", "nvlink_data_rate"})


def _worst(items: list[tuple[str, float]], highest: bool) -> dict | None:
    if not items:
        return None
    comp, value = (max if highest else min)(items, key=lambda kv: kv[1])
    return {"value": round(float(value), 6), "component": comp}


def _port_figures(port: dict, deltas: dict, expected: float, interval: float | None) -> dict:
    """One InfiniBand port's figures: its link rate against the expected one, and its
    counters' rates over the interval."""
    fig: dict = {"port": port["name"]}
    if expected and port.get("rate_gbps") is not None:
        fig["link_ratio"] = port["rate_gbps"] / expected
    if interval is None:
        return fig
    counts = port.get("counters") or {}

    def delta(c: str) -> int | None:
        # A counter held at its maximum (IB counters stop there) shows no rate, never 0.
        if saturated(c, counts.get(c)):
            return None
        return deltas.get(f"tm/ib/{port['name']}/{c}")

    for c in IB_COUNTERS:
        d = delta(c)
        if d is not None:
            # port_*_data count octets / 4 (IB spec PortCounters): bytes per second.
            fig[c + "_rate"] = d * (4 if c.endswith("_data") else 1) / interval
    # Every error counter read has a rise on record, or no sum: one stopped at its maximum,
    # or read again after a run it did not answer, would understate it.
    errors = [delta(c) for c in IB_ERRORS if c in counts]
    if errors and all(d is not None for d in errors):
        fig["error_rate"] = sum(d for d in errors if d is not None) / interval
    return fig


def sample(state, cfg: dict) -> tuple[dict, float | None, dict, list[dict]]:
    """(metrics {name: {value, component}}, interval_s, per-GPU figures, per-port figures)."""
    tcfg = cfg["telemetry"]
    interval = interval_s(state, tcfg)
    gpus = {comp: gpu_sample(g, state, tcfg, interval) for g, comp in readable_gpus(state)}
    metrics: dict[str, dict] = {}
    for key, metric, highest in GPU_METRICS:
        if key in BUSY_ONLY:
            items = [(c, f[key]) for c, f in gpus.items() if f.get("busy") and key in f]
        else:
            items = [(c, f[key]) for c, f in gpus.items() if key in f]
        worst = _worst(items, highest)
        if worst is not None:
            metrics[metric.value] = worst
    read = state.extra.get(FAMILY) or {"ports": []}
    expected = float(cfg["infiniband"]["rate_gbps"])
    # After a hang of the ports' read their counters rose over more than this interval: no
    # rate this run (the next one's is the real one).
    ib_interval = None if read.get("after_hang") else interval
    ports = [_port_figures(port, state.deltas, expected, ib_interval) for port in read["ports"]
             if (port.get("link_layer") or "InfiniBand") == "InfiniBand"]
    for key, metric, highest in (("port_xmit_wait_rate", Metric.IB_XMIT_WAIT_RATE, True),
                                 ("link_ratio", Metric.IB_LINK_RATIO, False),
                                 ("error_rate", Metric.IB_ERROR_RATE, True)):
        worst = _worst([(f["port"], f[key]) for f in ports if key in f], highest)
        if worst is not None:
            metrics[metric.value] = worst
    return metrics, interval, gpus, ports


def check(state, cfg: dict) -> list[Finding]:
    tcfg = cfg["telemetry"]
    metrics, interval, gpus, ports = sample(state, cfg)
    out: list[Finding] = []
    hw_limit = float(tcfg["hw_throttle_warn_frac"])
    pcie_limit = float(tcfg["pcie_link_warn_ratio"])
    for comp, fig in gpus.items():
        if fig.get("hw_frac", 0.0) > hw_limit:
            out.append(warn(FAMILY, comp, "gpu_hw_throttle",
                            f"{comp} clocks held down ({fig['hw_reason']}) "
                            f"{fig['hw_frac']:.0%} of the last {interval:.0f}s "
                            f"(warn above {hw_limit:.0%})",
                            fraction=round(fig["hw_frac"], 4), reason_kind=fig["hw_reason"],
                            interval_s=interval))
        if fig.get("busy") and fig.get("pcie_link_ratio", 1.0) < pcie_limit:
            pcie = g_pcie(state, comp)
            out.append(warn(FAMILY, comp, "gpu_pcie_slow",
                            f"{comp} busy on a PCIe link at {fig['pcie_link_ratio']:.0%} of its "
                            f"maximum (Gen{pcie.get('gen')} x{pcie.get('width')} of "
                            f"Gen{pcie.get('max_gen')} x{pcie.get('max_width')})",
                            link_ratio=round(fig["pcie_link_ratio"], 4)))
        out.extend(_gpu_warnings(comp, fig, tcfg, interval))
    summary = ", ".join(f"{k}={v['value']:g}" for k, v in sorted(metrics.items())) or "nothing"
    out.append(ok(FAMILY, "node", f"sampled {summary}", metrics=metrics, interval_s=interval,
                  gpus=gpus, ports=ports))
    return out


def _gpu_warnings(comp: str, fig: dict, tcfg: dict, interval: float | None) -> list[Finding]:
    """NVLink errors and row-remap exhaustion past their warn lines ([telemetry] warn_above,
    the lines the rollups count against): what a healthy GPU never does; warnings only."""
    above = tcfg.get("warn_above") or {}
    out: list[Finding] = []
    limit = above.get(Metric.NVLINK_ERROR_RATE.value)
    rate = fig.get("nvlink_error_rate")
    if limit is not None and rate is not None and rate > float(limit):
        out.append(warn(FAMILY, comp, "gpu_nvlink_errors",
                        f"{comp} NVLink errors (CRC, replay, recovery) at {rate:.3g}/s over the "
                        f"last {interval:.0f}s (warn above {float(limit):g}/s)",
                        rate=round(rate, 6), interval_s=interval))
    limit = above.get(Metric.REMAP_LOW_BANKS.value)
    low = fig.get("remap_low_banks")
    if limit is not None and low is not None and low > float(limit):
        out.append(warn(FAMILY, comp, "gpu_remap_low",
                        f"{comp} has {low:.0f} memory bank(s) with low or no row-remap "
                        f"availability left: the next uncorrectable error there may not remap",
                        banks=int(low), remapped_rows=fig.get("remapped_rows")))
    return out


def g_pcie(state, comp: str) -> dict:
    for g, c in readable_gpus(state):
        if c == comp and isinstance(g.answers.get("pcie"), dict):
            return g.answers["pcie"]
    return {}
