"""The node path's doors to the standard library's C accelerators (rsc_health.compat): the same
answers as the modules a job start no longer imports, on real-format values."""

from __future__ import annotations

import datetime as std_datetime
import json
import subprocess
import sys

import pytest

from rsc_health import compat

# What the node path writes and reads: spool records, cursors, NVML replays, refusal lists.
DOCUMENTS = [
    {"node": "gpu017", "check": "xid", "status": "fail", "severity": "drain_now",
     "detail": "NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, GPU has fallen off the bus.",
     "values": [79, 0.5, -0.0, 1e300, 10**30, None, True, False], "tab\there": "é\u2028\n\"\\"},
    [], {}, "just a string", 3, 2.5, None, [float("inf"), float("-inf")],
    {"nested": {"z": [{"y": "\x00\x1f"}], "a": {}}, "": ""},
]


@pytest.mark.parametrize("doc", DOCUMENTS)
@pytest.mark.parametrize("options", [{}, {"sort_keys": True}, {"separators": (",", ":")}])
def test_the_json_door_writes_what_json_writes_and_reads_it_back(doc, options):
    text = compat.json_dumps(doc, **options)
    assert text == json.dumps(doc, **options)
    assert repr(compat.json_loads(text)) == repr(json.loads(text))
    assert repr(compat.json_loads(text.encode())) == repr(json.loads(text.encode()))


@pytest.mark.parametrize("bad", ["", "   ", "{", "[1,]", "1 2", "nul", '{"a": 1}x', "\ufeff{}",
                                 '{"a": NaN', "[" * 10 + "]" * 9, b"\xff\xfe{}", b"\x80abc"])
def test_the_json_door_refuses_what_json_refuses(bad):
    with pytest.raises(ValueError) as ours:
        compat.json_loads(bad)
    with pytest.raises(ValueError) as theirs:
        json.loads(bad)
    assert str(ours.value) == str(theirs.value)


def test_the_json_door_reads_constants_and_whitespace_as_json_does():
    text = ' \n\t{"a": [NaN, Infinity, -Infinity, 1E3, -12]}\r\n '
    assert repr(compat.json_loads(text)) == repr(json.loads(text))
    assert compat.json_loads(b"\xef\xbb\xbf[1]") == [1]  # bytes with a BOM: json's own rule


def test_the_json_door_refuses_what_it_cannot_write_unless_told():
    with pytest.raises(TypeError, match="not JSON serializable"):
        compat.json_dumps({"x": object()})
    when = std_datetime.datetime(2026, 11, 27, 13, 30, tzinfo=std_datetime.UTC)
    assert compat.json_dumps({"t": when}, default=str) == json.dumps({"t": when}, default=str)
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="Circular"):
        compat.json_dumps(loop)


def test_the_datetime_door_is_the_standard_librarys_own_types():
    assert compat.datetime is std_datetime.datetime
    assert compat.timezone is std_datetime.timezone
    assert compat.timedelta is std_datetime.timedelta
    assert compat.UTC is std_datetime.UTC


def test_the_doors_import_neither_json_nor_datetime_nor_re():
    code = ("import sys; import rsc_health.compat as c; c.json_loads('{\"a\": [1, 2.5]}'); "
            "c.json_dumps({'a': c.datetime.now(c.UTC)}, default=str); "
            "print(sorted(m for m in ('json', 're', 'datetime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-S", "-c", code], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(__import__("pathlib").Path(
                             compat.__file__).parents[1])}).stdout
    assert out.strip() == "[]"


def test_a_state_file_cut_short_is_refused_as_json_refuses_it_in_a_fresh_interpreter():
    """A power cut leaves '{"boot_id": "0b2c' in a state file. The C scanner says what is wrong
    with it through json.decoder.JSONDecodeError, which it looks up in sys.modules without
    importing it (3.10, 3.11): on a job start that has not imported json, it raised
    SystemError ('returned NULL without setting an exception'), which no caller catches: the
    sweep ended in a checker fault instead of reading the file as lost."""
    bad = ['{"boot_id": "0b2c', "[1, 2", '{"a" 1}', '{"a": "\\x"}', '["\x01"]', '{"a": 1,}',
           '{"a": [1, 2}', "[" * 5000 + "]" * 4999]
    def said(loads, text):
        try:
            return repr(loads(text))
        except BaseException as exc:  # noqa: BLE001 - what each raises is what is compared
            return f"{type(exc).__name__}: {str(exc)[:80]}"

    code = ("import sys\n"
            "from rsc_health import compat  # no json imported: a job start's interpreter\n"
            "def said(loads, text):\n"
            "    try:\n"
            "        return repr(loads(text))\n"
            "    except BaseException as exc:\n"
            "        return f'{type(exc).__name__}: {str(exc)[:80]}'\n"
            f"for text in {bad!r}:\n"
            "    print(said(compat.json_loads, text))\n"
            "print('json' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], check=True, capture_output=True,
                         text=True, env={"PYTHONPATH": str(__import__("pathlib").Path(
                             compat.__file__).parents[1])}).stdout.splitlines()
    assert out[:-1] == [said(json.loads, text) for text in bad]
    assert sum(line.startswith("JSONDecodeError: ") for line in out) == len(bad) - 1, out
