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
from report_page import check_page

from difftransformer.report import HELD, INCONCLUSIVE, NOT_HELD, SMOKE, write_report
from difftransformer.report.verdicts import verdicts


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
    # The tiny runs train a few steps: a smoke run, so no row may carry a coloured verdict.
    assert {v["verdict"] for v in results["verdicts"]} == {SMOKE}
    for name in ("training", "needles", "noise", "outliers", "quantized", "positions", "icl", "attnmap"):
        assert (out / f"{name}.png").stat().st_size > 1000, name


def test_report_renders_in_chromium(report, tmp_path):
    browser = chromium()
    args = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*args, "--dump-dom", report.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    page = PageParts()
    page.feed(dom.stdout)
    check_page(dom.stdout)  # every table under its heading, no Markdown backticks in the text
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
    r = subprocess.run([*args, f"--screenshot={shot}", "--window-size=1200,2400", report.resolve().as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 10_000, r.stderr[-2000:]


def _fake_runs(val: dict[str, list[float]], steps: int = 500) -> list:
    """Stand-in runs with only training summaries: validation loss per variant per seed."""
    from types import SimpleNamespace

    from difftransformer.report.results import RunResults
    out = []
    for variant, losses in val.items():
        for seed, v in enumerate(losses):
            ev = SimpleNamespace(attention=variant, seed=seed, label=f"{variant} seed {seed}")
            out.append(RunResults(ev, {"step": [steps], "final_val_loss": v, "spikes": [], "grad_norm_max": 1.0}))
    return out


def _loss_verdict(rows, variant="diff_v1"):
    return next(r for r in rows if r["claim"].startswith("lower validation loss") and r["variant"] == variant)


def test_verdicts_on_known_inputs():
    """Paired seeds: a clear win holds, a clear loss does not hold, noise around zero and one seed (no spread, no
    within-seed error for the loss) are inconclusive, a short run is a smoke run; each with its interval."""
    base = [3.50, 3.60, 3.40]
    win = verdicts(_fake_runs({"baseline": base, "diff_v1": [b - 0.10 for b in base]}))
    assert _loss_verdict(win)["verdict"] == HELD and _loss_verdict(win)["stats"]["ci"][1] < 0
    loss = verdicts(_fake_runs({"baseline": base, "diff_v1": [b + 0.10 for b in base]}))
    assert _loss_verdict(loss)["verdict"] == NOT_HELD
    noise = verdicts(_fake_runs({"baseline": base, "diff_v1": [3.45, 3.70, 3.38]}))
    assert _loss_verdict(noise)["verdict"] == INCONCLUSIVE
    one = verdicts(_fake_runs({"baseline": [3.5], "diff_v1": [3.0]}))
    assert _loss_verdict(one)["verdict"] == INCONCLUSIVE
    smoke = verdicts(_fake_runs({"baseline": base, "diff_v1": [b - 0.10 for b in base]}, steps=30))
    assert {r["verdict"] for r in smoke} == {SMOKE}
    # A claim whose analysis did not run reads inconclusive, never held.
    assert {r["verdict"] for r in win if r["claim"].startswith("better multi-needle")} == {INCONCLUSIVE}


def test_learned_lambda_reaches_the_report(evs):
    """Each DIFF run's learned lambda (the trainer's metrics key, defined once in rundir) shows in the training
    summary the report tabulates; the old parser looked for a key the trainer never wrote, so V2's stayed empty."""
    from difftransformer import rundir
    from difftransformer.report.training import training_summary

    for variant, key in (("diff_v1", rundir.LAMBDA_V1), ("diff_v2", rundir.LAMBDA_V2)):
        lam = training_summary(evs[variant])["lambda"]
        assert lam["name"] == key and len(lam["values"]) == len(evs[variant].model.layers)
    assert training_summary(evs["baseline"])["lambda"] == {}


def test_a_figure_wider_than_the_column_scrolls_instead_of_shrinking(tmp_path):
    """Fig. 1 with a token under each key is wider than the page: shown at its own size in a sideways-scrolling box;
    one that fits the column is an ordinary (scaled) image."""
    from PIL import Image

    from difftransformer.report.html import COLUMN_PX, wide_image

    for width, wide in ((COLUMN_PX, False), (2 * COLUMN_PX, True)):
        Image.new("RGB", (width, 50), "white").save(tmp_path / "f.png")
        html = wide_image(tmp_path / "f.png", "Fig. 1")
        assert ("<div class='wide'>" in html) == wide and ("scroll sideways" in html) == wide
