"""The report in a real headless browser (Debian's chromium): the page loads without console
errors and every image decodes (naturalWidth > 0). A screenshot is kept under test-artifacts/.

A harness script is put at the top of a copy of the page: it records console.error/warn calls,
uncaught errors and failed resource loads, and after `load` writes what it saw into the DOM,
which `--dump-dom` hands back. Chromium's own console log (stderr) is checked as well.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rsc_health.report.data import ReportData
from rsc_health.report.plots import FIGURES
from rsc_health.report.render import write_report

from .conftest import AS_OF

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed"),
]

HARNESS = """<script>
(() => {
  const seen = {errors: [], console: []};
  for (const level of ["error", "warn"]) {
    const original = console[level].bind(console);
    console[level] = (...args) => {
      seen.console.push(level + ": " + args.join(" "));
      original(...args);
    };
  }
  window.addEventListener("error", (e) => {
    const t = e.target;
    seen.errors.push(t && t !== window ? "failed to load " + (t.src || t.href) : String(e.message));
  }, true);
  window.addEventListener("load", () => {
    seen.images = [...document.images].map(
      (i) => ({src: i.src.slice(0, 300), width: i.naturalWidth}));
    const out = document.createElement("pre");
    out.id = "harness-result";
    out.textContent = JSON.stringify(seen);
    document.body.appendChild(out);
    console.log("harness-done");
  });
})();
</script>"""

BASE_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--hide-scrollbars", "--virtual-time-budget=10000"]


def _chromium(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    cmd = [CHROMIUM, *BASE_FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr",
           "--v=0", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def _load(page: Path, tmp_path: Path) -> tuple[dict, list[str]]:
    harnessed = page.with_name("harnessed-" + page.name)
    html = page.read_text()
    harnessed.write_text(html.replace("<head>", "<head>\n" + HARNESS, 1))
    proc = _chromium(["--dump-dom", harnessed.as_uri()], tmp_path)
    match = re.search(r'<pre id="harness-result">(.*?)</pre>', proc.stdout, re.S)
    assert match, f"harness never reported; chromium stderr:\n{proc.stderr[-3000:]}"
    result = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    console = re.findall(r"INFO:CONSOLE\S*\] (.*)", proc.stderr)
    return result, console


def _page_console(console: list[str]) -> list[str]:
    return [line for line in console if '"harness-done"' not in line]


def test_report_loads_without_console_errors_and_every_image_renders(report_data, tmp_path):
    written = write_report(report_data, tmp_path / "report")
    result, console = _load(written.html, tmp_path)
    # The harness's own log line proves chromium's console capture works in this run.
    assert any('"harness-done"' in line for line in console)
    assert _page_console(console) == []
    assert result["errors"] == [] and result["console"] == []
    assert len(result["images"]) == len(FIGURES)
    assert all(img["width"] > 0 for img in result["images"]), result["images"]

    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-screenshot.png"
    shot.unlink(missing_ok=True)
    _chromium([f"--screenshot={shot}", "--window-size=1280,3600", written.html.as_uri()],
              tmp_path)
    assert shot.exists() and shot.stat().st_size > 20_000


def test_empty_and_embedded_reports_render_in_the_browser(tmp_path):
    written = write_report(ReportData(as_of=AS_OF), tmp_path / "empty", embed=True)
    result, console = _load(written.html, tmp_path)
    assert _page_console(console) == [] and result["errors"] == []
    assert [img["src"][:22] for img in result["images"]] == ["data:image/png;base64,"] * len(
        FIGURES)
    assert all(img["width"] > 0 for img in result["images"])


def test_harness_notices_a_broken_image(report_data, tmp_path):
    """The checker itself must be able to fail: a missing PNG is reported and has width 0."""
    written = write_report(report_data, tmp_path / "broken")
    missing = FIGURES["mttf"][0]
    (written.html.parent / missing).unlink()
    result, _console = _load(written.html, tmp_path)
    widths = {Path(img["src"]).name: img["width"] for img in result["images"]}
    assert widths[missing] == 0
    assert any(missing in error for error in result["errors"])
