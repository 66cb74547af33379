"""Fakes for the site-check tests: small check programs and a stand-in for LBNL NHC's `nhc`."""

from __future__ import annotations

import os
from pathlib import Path

# A stand-in for NHC's driver script, printing what the real one prints. Taken from mej/nhc at
# 9c4a38c (github.com/mej/nhc, file `nhc`): die() logs `ERROR:  $NAME:  Health check failed:  $*`
# (to the caller's stdout: `oecho` when LOGFILE is set, `log` otherwise) and, without -a, exits with
# its status at the first failure; with -a (NHC_CHECK_ALL=1) nhcmain_run_checks ends with `ERROR:
# $NAME:  $FAIL_CNT health checks failed.` and `exit $FAIL_CNT`; the ALRM trap is `die 142 "Script
# timed out${CHECK:+ while executing \"$CHECK\"}."`; `VAR=value` arguments are eval'd; a missing
# config file is `exit 0`. The messages are the checks' own: `MSG="$FUNCNAME:  $FS not mounted"`
# (scripts/lbnl_fs.nhc, check_fs_mount) and `die 1 "$FUNCNAME:  Actual RAM size ($HW_RAM_TOTAL kB)
# less than minimum allowed ($RAM_MIN kB)."` (scripts/lbnl_hw.nhc, check_hw_physmem).
# The scenario is read from <conf>.mode; the arguments are written to <conf>.args.
FAKE_NHC = r"""#!/bin/bash
CONF=/etc/nhc/nhc.conf
ARGS=("$@")
while getopts ":ac:t:dv" OPTION; do
    case "$OPTION" in
        a) NHC_CHECK_ALL=1 ;;
        c) CONF="$OPTARG" ;;
        t) TIMEOUT="$OPTARG" ;;
    esac
done
shift $((OPTIND-1))
while [[ -n "$1" ]]; do eval "$1"; shift; done
printf '%s\n' "${ARGS[@]}" > "$CONF.args"
[[ -f "$CONF" ]] || exit 0
MODE=$(cat "$CONF.mode" 2>/dev/null || echo pass)
FAILED="ERROR:  nhc:  Health check failed:  "
case "$MODE" in
    pass) exit 0 ;;
    fail)
        echo "${FAILED}check_fs_mount:  /scratch not mounted"
        [[ "$NHC_CHECK_ALL" == 1 ]] || exit 1  # without -a NHC stops at the first failure
        RAM="Actual RAM size (1000 kB) less than minimum allowed (2000 kB)."
        echo "${FAILED}check_hw_physmem:  $RAM"
        echo "${FAILED}check_fs_mount:  /home not mounted"
        echo "ERROR:  nhc:  3 health checks failed."
        exit 3 ;;
    watchdog)
        echo "${FAILED}Script timed out while executing \"check_fs_mount -f /scratch\"."
        exit 142 ;;
    hang)
        sleep 300 &
        echo $! > "$CONF.child"
        wait ;;
    garbage)
        printf '\x00\xff\xfe\x01 not nhc\nSegmentation fault\n'
        exit 1 ;;
esac
"""

NHC_CONF = """# nhc.conf as sites write it (mej/nhc nhc.conf syntax: target || check)
* || check_fs_mount_rw -f /scratch
* || check_hw_physmem 2000kB 4000kB 3%
"""


def program(directory: Path, name: str, body: str | bytes, mode: int = 0o755) -> Path:
    """Write an executable (or not, by mode) into the checks directory."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    if isinstance(body, bytes):
        path.write_bytes(body)
    else:
        path.write_text(body)
    os.chmod(path, mode)
    return path


def fake_nhc(root: Path, mode: str) -> tuple[Path, Path]:
    """(nhc under root, nhc.conf under root) for the given scenario."""
    nhc = program(root / "usr/sbin", "nhc", FAKE_NHC)
    conf = root / "etc/nhc/nhc.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(NHC_CONF)
    Path(f"{conf}.mode").write_text(mode)
    return nhc, conf


REAL_NHC = Path(__file__).resolve().parents[1] / "fixtures" / "nhc"


def real_nhc(root: Path, conf_text: str,
             scripts: dict[str, str] | None = None) -> tuple[Path, Path]:
    """(nhc under root, nhc.conf under root): LBNL NHC's own driver and check functions
    (tests/fixtures/nhc, mej/nhc 9c4a38c), with `scripts` ({name: text}) added to its INCDIR
    (/etc/nhc/scripts) and a settings file (/etc/sysconfig/nhc, real NHC syntax) that sends its
    log under root."""
    nhc = program(root / "usr/sbin", "nhc", (REAL_NHC / "nhc").read_text())
    incdir = root / "etc/nhc/scripts"
    incdir.mkdir(parents=True, exist_ok=True)
    for name in ("common.nhc", "lbnl_fs.nhc"):
        (incdir / name).write_text((REAL_NHC / "scripts" / name).read_text())
    for name, text in (scripts or {}).items():
        (incdir / name).write_text(text)
    sysconfig = root / "etc/sysconfig"
    sysconfig.mkdir(parents=True, exist_ok=True)
    (sysconfig / "nhc").write_text(f'LOGFILE=">>{root}/nhc.log 2>&1"\n'
                                   f'RESULTFILE="{root}/nhc.status"\n')
    conf = root / "etc/nhc/nhc.conf"
    conf.write_text(conf_text)
    return nhc, conf


def gone(pid: int) -> bool:
    """True once the process is dead (a zombie waiting for init to reap it counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")
