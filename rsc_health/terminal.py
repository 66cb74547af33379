"""Text from Slurm, the historian or a node (reasons, comments, node, job and user names)
printed for a person: anything a terminal would act on instead of show (ESC and the other C0
and C1 controls, DEL, a newline that would forge a line, bidi overrides) is written as its
escape (`\\x1b`, `\\n`, `\\u202e`), so a drain reason cannot clear the operator's screen, retitle
the terminal or fake another node's line. JSON output needs none of this (json.dumps escapes).

Standard library and click only: `healthctl status` and `node` print through it.
"""

from __future__ import annotations

import click


def shown(text: object) -> str:
    """`text` with every character str.isprintable() refuses escaped; the rest as it was."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def echo(line: object = "", *, err: bool = False) -> None:
    """click.echo of one line holding others' text, escaped (its own newline added after)."""
    click.echo(shown(line), err=err)
