"""Lazy patterns (rsc_health.lazyre): nothing of `re` is paid for until a pattern is used, and
what a module takes from lazyre instead of re (flags, escape) is re's own."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from rsc_health import lazyre

REPO = Path(__file__).resolve().parents[2]


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-S", "-c", code], check=True, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO)}).stdout.strip()


def test_a_module_of_lazy_patterns_imports_no_re_until_one_is_used():
    out = run("import sys; from rsc_health import lazyre\n"
              "p = lazyre.compile(r'^rsc_health:(?P<m>[a-z]+)', lazyre.IGNORECASE)\n"
              "print('re' in sys.modules, end=' ')\n"
              "print(p.match('RSC_HEALTH:now')['m'], 're' in sys.modules)")
    assert out == "False now True"


def test_lazyre_flags_and_escape_are_res_own():
    for name in ("ASCII", "A", "IGNORECASE", "I", "MULTILINE", "M", "DOTALL", "S", "VERBOSE",
                 "X"):
        assert getattr(lazyre, name) == getattr(re, name), name
    text = "".join(map(chr, range(0x800))) + "rsc_health:now:xid79:gpu3 (+2 more) [a-b]{1,2}"
    assert lazyre.escape(text) == re.escape(text)
    pat = lazyre.compile(lazyre.escape("a.b(c)") + "$", lazyre.I | lazyre.M)
    assert pat.match("A.B(C)") and not pat.match("axb(c)") and pat.flags & re.IGNORECASE
