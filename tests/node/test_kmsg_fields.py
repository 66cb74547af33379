"""The healthy job start reads the kernel ring and the InfiniBand ports' rates with str methods,
not patterns (issue 25's prolog diet: `re` with its `enum` is 25 M instructions of a 38 M bare
start): each reader gives exactly what the pattern it replaced gives, on real records and on
every arrangement of the characters that decide a match."""

from __future__ import annotations

import itertools
import random
import re

import pytest

from rsc_health.checks.infiniband import parse_rate
from rsc_health.collect import kmsg

# The patterns the readers replaced, as they stood (kmsg._KMSG is still the module's own).
KMSG = re.compile(r"^(?P<prio>\d+),(?P<seq>\d+),(?P<usec>\d+),[^;]*;(?P<msg>.*)$")
RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")

RECORDS = [
    "4,1234,567890123,-;NVRM: Xid (PCI:0000:1b:00): 79, pid=1234, GPU has fallen off the bus.",
    "6,0,0,-;Linux version 5.15.0-91-generic",
    "3,88,123,c,caller=T12;mlx5_core 0000:0c:00.0: port 1 link down",
    "4,2,3,-;",  # an empty message
    "4,2,3,-;a message\n",  # a last newline (the record's own end)
    "4,2,3,-;two\nlines",
    "12,99999999999,1,-,more;fields;with;semicolons",
    " SUBSYSTEM=pci",  # a continuation line of a record's dictionary
    "NVRM: Xid (PCI:0000:1b:00): 79",
    "4,-1,3,-;negative",
    "\u0664,\u0661\u0662,3,-;Arabic-Indic digits are re's \\d too",
    "\u00b2,1,1,-;a superscript is not",
    "",
]
RATES = ["200 Gb/sec (4X HDR)", "100 Gb/sec (4X EDR)", "  25.78125 Gb/sec (1X EDR)",
         "400 Gb/sec (4X NDR)\n", "10 Gb/s", "Gb/sec", "12. Gb/sec", ".5 Gb/sec", "\t40\tGb/sec",
         "\u00a056 Gb/sec", "\u0665\u0660 Gb/sec", "", "garbled\x00"]


def _kmsg_by_pattern(line: str):
    m = KMSG.match(line)
    return None if m is None else (m.group("prio"), m.group("seq"), m.group("usec"),
                                   m.group("msg"))


def _rate_by_pattern(text):
    m = RATE.match(text or "")
    return float(m.group(1)) if m else None


@pytest.mark.parametrize("line", RECORDS)
def test_a_ring_record_reads_as_the_pattern_read_it(line):
    assert kmsg.kmsg_fields(line) == _kmsg_by_pattern(line)
    assert kmsg._KMSG.pattern == KMSG.pattern  # the module keeps the pattern it matches


def test_every_short_arrangement_of_the_deciding_characters_reads_as_the_pattern_read_it():
    alphabet = "19,;\n-a \u0661\u00b2\r"
    for n in range(7):
        for chars in itertools.product(alphabet, repeat=n) if n <= 5 else ():
            line = "".join(chars)
            assert kmsg.kmsg_fields(line) == _kmsg_by_pattern(line), repr(line)
    rng = random.Random(25)
    for _ in range(20000):
        line = "".join(rng.choice(alphabet) for _ in range(rng.randint(6, 16)))
        if rng.random() < 0.5:
            line = f"{rng.randint(0, 7)},{rng.randint(0, 99)},{rng.randint(0, 999)},-;" + line
        assert kmsg.kmsg_fields(line) == _kmsg_by_pattern(line), repr(line)


@pytest.mark.parametrize("text", [*RATES, None])
def test_a_port_rate_reads_as_the_pattern_read_it(text):
    assert parse_rate(text) == _rate_by_pattern(text)


def test_every_short_arrangement_of_a_rates_characters_reads_as_the_pattern_read_it():
    pieces = ["1", "0", ".", " ", "\t", "\x1c", "\u00a0", "Gb/sec", "Gb", "/sec", "\u0661",
              "\u00b2", "x"]
    for n in range(5):
        for parts in itertools.product(pieces, repeat=n):
            text = "".join(parts)
            assert parse_rate(text) == _rate_by_pattern(text), repr(text)


def test_a_ring_record_past_max_seq_or_not_a_record_has_no_sequence_number():
    assert kmsg._seq_usec("4,1234,567890123,-;x") == (1234, 567890123)
    assert kmsg._seq_usec(f"4,{kmsg.MAX_SEQ + 1},1,-;x") is None
    assert kmsg._seq_usec(" SUBSYSTEM=pci") is None
    assert kmsg.strip_prefix("4,77,1,-;NVRM: Xid 79") == ("NVRM: Xid 79", 77)
