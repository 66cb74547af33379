"""Links from every node the report names: to its story (`healthctl node NODE`, the command an
operator runs next) and, when `[report] node_url` / `dashboard_url` are set, to the site's own
pages (a Grafana node dashboard). One door: the page, summary.txt and `healthctl node` all ask
`Links` for a node's links, so the report and the node view point at the same places.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

STORY = "healthctl node {node}"


def story(node: str) -> str:
    """The command that tells one node's whole story, to paste into a shell: the name quoted
    for it (a node name is the historian's text, from every node's deliveries: `;`, `$(...)`
    or a backquote in it must not run as the operator). A plain name stays as it is."""
    return STORY.format(node=shlex.quote(str(node)))


def _linkable(template: str) -> bool:
    """http(s) or a path on the same site; never javascript:, data: or file: (the page is
    opened by people with rights on the fleet)."""
    try:
        scheme = urlsplit(template.replace("{node}", "x")).scheme.lower()
    except ValueError:
        return False
    return scheme in ("http", "https", "")


@dataclass(frozen=True)
class Links:
    node_url: str = ""
    dashboard_url: str = ""

    @classmethod
    def from_config(cls, report: Mapping[str, Any] | None) -> Links:
        """The `[report]` section (over the packaged defaults: both empty)."""
        from rsc_health.config import with_defaults

        section = with_defaults("report", report)
        node_url, dashboard_url = str(section["node_url"]), str(section["dashboard_url"])
        return cls(node_url if _linkable(node_url) else "",
                   dashboard_url if _linkable(dashboard_url) else "")

    def node(self, node: str) -> str:
        """The node's page, "" when none is configured. The name is URL-escaped whole (a
        node name is the historian's text, not ours)."""
        if not self.node_url:
            return ""
        return self.node_url.replace("{node}", quote(str(node), safe=""))

    def dashboard(self, node: str = "") -> str:
        if not self.dashboard_url:
            return ""
        return self.dashboard_url.replace("{node}", quote(str(node), safe=""))

    def of(self, node: str) -> dict[str, str]:
        """Everything one node links to: {story, node_url, dashboard_url} (empty ones kept)."""
        return {"story": story(node), "node_url": self.node(node),
                "dashboard_url": self.dashboard(node)}
