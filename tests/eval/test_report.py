"""The HTML report: written over three tiny runs, rendered in headless Chromium, its tables and images present.

Chromium is Debian's `chromium` package (`make test` installs it when missing); without it the rendering test fails
rather than skips, since the report's promise is a page a person can open.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from difftransformer.eval.report import HELD, INCONCLUSIVE, NOT_HELD, Measure, compare, write_report


class PageParts(HTMLParser):
    """Counts tables (and their rows) and collects <img> sources and section headings of a rendered DOM."""

    def __init__(self) -> None:
        super().__init__()
        self.tables, self.rows, self.images, self.headings, self._h = 0, 0, [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables += 1
        elif tag == "tr":
            self.rows += 1
        elif tag == "img":
            self.images.append(dict(attrs).get("src", ""))
        elif tag in ("h1", "h2"):
            self._h = ""

    def handle_data(self, data):
        if self._h is not None:
            self._h += data

    def handle_endtag(self, tag):
        if tag in ("h1", "h2") and self._h is not None:
            self.headings.append(self._h.strip())
            self._h = None


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.fail("headless Chromium is needed to render the report (apt-get install chromium; `make test` does it)")


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    path = write_report([runs[v] for v in ("baseline", "diff_v1", "diff_v2")], out, quick=True, progress=False,
                        preface="test run")
    return path


def test_report_files_and_results(report):
    out = report.parent
    results = json.loads((out / "results.json").read_text())
    assert [r["model"]["attention"] for r in results["runs"]] == ["baseline", "diff_v1", "diff_v2"]
    for r in results["runs"]:  # every analysis ran on every model of the tiny runs
        assert set(r["results"]) == {"needles", "noise", "outliers", "quantized", "positions", "icl"}, r["errors"]
    assert results["verdicts"], "no verdict rows"
    assert {v["verdict"] for v in results["verdicts"]} <= {HELD, NOT_HELD, INCONCLUSIVE, "not measured"}
    for name in ("training", "needles", "noise", "outliers", "quantized", "positions", "icl", "attnmap"):
        assert (out / f"{name}.png").stat().st_size > 1000, name


def test_report_renders_in_chromium(report, tmp_path):
    browser = chromium()
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(args + ["--dump-dom", report.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageParts()
    page.feed(dom.stdout)
    assert page.tables >= 7 and page.rows >= 40, (page.tables, page.rows)
    for heading in ("Verdicts", "Multi-needle retrieval", "Attention noise", "NLL by position"):
        assert any(heading in h for h in page.headings), (heading, page.headings)
    # Self-contained: every image is an embedded PNG that decodes to a real picture.
    assert len(page.images) >= 8
    from PIL import Image  # matplotlib's dependency
    for src in page.images:
        m = re.fullmatch(r"data:image/png;base64,(.+)", src, flags=re.S)
        assert m, src[:80]
        img = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
        assert img.size[0] > 100 and img.size[1] > 100
    shot = tmp_path / "page.png"
    r = subprocess.run(args + [f"--screenshot={shot}", "--window-size=1200,2400", report.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]


def test_verdict_rule():
    """Held / did not hold / inconclusive by the stated margin (two combined standard errors, a minimum effect)."""
    base = [Measure(0.50, 0.01)]
    assert compare(base, [Measure(0.70, 0.01)], True, 0.05)[0] == HELD
    assert compare(base, [Measure(0.30, 0.01)], True, 0.05)[0] == NOT_HELD
    assert compare(base, [Measure(0.52, 0.01)], True, 0.05)[0] == INCONCLUSIVE  # inside the minimum effect
    assert compare(base, [Measure(0.60, 0.10)], True, 0.05)[0] == INCONCLUSIVE  # inside 2 standard errors
    assert compare(base, [Measure(0.30, 0.01)], False, 0.05)[0] == HELD  # lower is better


def test_learned_lambda_reaches_the_report(evs):
    """Each DIFF run's learned lambda (the trainer's metrics key, defined once in rundir) shows in the training
    summary the report tabulates; the old parser looked for a key the trainer never wrote, so V2's stayed empty."""
    from difftransformer import rundir
    from difftransformer.eval.report.training import training_summary

    for variant, key in (("diff_v1", rundir.LAMBDA_V1), ("diff_v2", rundir.LAMBDA_V2)):
        lam = training_summary(evs[variant])["lambda"]
        assert lam["name"] == key and len(lam["values"]) == len(evs[variant].model.layers)
    assert training_summary(evs["baseline"])["lambda"] == {}
