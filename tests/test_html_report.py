"""The HTML report renders in a real headless browser: no console errors, every image resolves,
every CSV link points at a file, and a screenshot is produced."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tokenfactory.studies import run_study
from tokenfactory.studies.html import render_index, write_index

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    for name in ("operating-modes", "feedback-oscillation"):
        run_study(name, root / name, quick=True)
    write_index(root, order=["operating-modes", "feedback-oscillation"])
    return root


def _browser():
    if CHROMIUM is None:
        if os.environ.get("TOKENFACTORY_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is required here (.ci/run installs Debian's chromium) but was not found")
        pytest.skip("no Chromium on this machine (install Debian's chromium; CI does)")
    from playwright.sync_api import sync_playwright

    return sync_playwright()


def _open(root: Path, shot: Path | None = None) -> dict:
    with _browser() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = b.new_page(viewport={"width": 1366, "height": 900})
        console = []
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
        page.goto((root / "index.html").as_uri(), wait_until="load")
        # lazy images load as they scroll into view: scroll through, then wait for all to settle
        page.evaluate("document.querySelectorAll('img').forEach(i => i.loading = 'eager')")
        page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=30_000)
        info = page.evaluate("""() => ({
            images: Array.from(document.images).map(i => ({src: i.getAttribute('src'), w: i.naturalWidth})),
            csv: Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))
                      .filter(h => h.endsWith('.csv') || h.endsWith('.json')),
            sections: document.querySelectorAll('section.study').length,
            overflow: document.documentElement.scrollWidth - window.innerWidth,
        })""")
        if shot is not None:
            page.screenshot(path=str(shot), full_page=False)
        b.close()
    info["console"] = console
    return info


def test_page_renders_in_headless_chromium(reports, tmp_path):
    shot = tmp_path / "report.png"
    info = _open(reports, shot)
    errors = [c for c in info["console"] if c[0] in ("error", "pageerror")]
    assert not errors, errors
    assert info["sections"] == 2
    broken = [i["src"] for i in info["images"] if i["w"] == 0]
    assert not broken, f"images that did not resolve: {broken}"
    expected = sum(len(json.loads((reports / s / "metrics.json").read_text())["report"]["figures"])
                   for s in ("operating-modes", "feedback-oscillation"))
    assert len(info["images"]) == expected >= 8
    for href in info["csv"]:
        assert (reports / href).is_file(), href
    assert info["overflow"] <= 0, "the page scrolls sideways on a laptop-width window"
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_browser_check_sees_a_missing_image(reports, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(reports, broken)
    victim = next((broken / "operating-modes").glob("*.png"))
    victim.unlink()
    info = _open(broken)
    assert [i["src"] for i in info["images"] if i["w"] == 0] == [f"operating-modes/{victim.name}"]
    assert any("ERR_FILE_NOT_FOUND" in c[1] for c in info["console"])


def test_page_carries_results_config_and_provenance(reports):
    page = render_index(reports)
    m = json.loads((reports / "feedback-oscillation" / "metrics.json").read_text())
    assert f"GM {m['smoothed']['gain_margin']:.2f}" in page           # the summary, rendered
    for f in m["report"]["figures"]:
        assert f"feedback-oscillation/{f['file']}" in page and f["caption"].split(":")[0] in page
    assert m["provenance"]["commit"][:12] in page and "Configuration" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page  # self-contained
