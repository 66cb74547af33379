"""What the node path takes from Python 3.11 and later, on the Python 3.9 and 3.10 that compute
nodes ship (RHEL 9: 3.9, Ubuntu 22.04: 3.10). The node-side modules (`[tool.rsc-health-node]`
in pyproject.toml) import these names from here, never from the standard library directly;
tests/static/test_node_python.py holds them to Python 3.9 with vermin.
"""

from __future__ import annotations

import enum
import os
import sys
import zipimport
from datetime import timezone

UTC = timezone.utc  # datetime.UTC is 3.11+

if sys.version_info >= (3, 11):
    from enum import StrEnum  # novermin

    import tomllib  # novermin
else:  # pragma: no cover - exercised on a 3.9/3.10 interpreter (tests/static)
    import tomli as tomllib  # the declared dependency for python_version < "3.11"

    class StrEnum(str, enum.Enum):
        """enum.StrEnum as 3.11 has it: str() and format() give the value."""

        __str__ = str.__str__
        __format__ = str.__format__

        @staticmethod
        def _generate_next_value_(name, start, count, last_values):
            return name.lower()



def packaged_bytes(path: os.PathLike | str) -> bytes | None:
    """The bytes of one of this package's own data files (default_config.toml, the XID
    catalog) when the package runs from a zip archive (the node zipapp, scripts/build-node);
    None when it is installed as files, which the caller reads as it reads any file."""
    loader = globals().get("__loader__")
    if isinstance(loader, zipimport.zipimporter):
        return loader.get_data(os.fspath(path))
    return None


def zip_archive() -> str | None:
    """The zip archive this package runs from (the node zipapp), or None."""
    loader = globals().get("__loader__")
    return loader.archive if isinstance(loader, zipimport.zipimporter) else None


__all__ = ["UTC", "StrEnum", "packaged_bytes", "tomllib", "zip_archive"]
