"""The HTML report renders in a real headless browser: no console errors, every image resolves
(embedded, so the page alone shows them), every CSV link points at a file, the first screen states
each loop's verdict and margins, and a screenshot is produced. Every study summary's tables keep
their columns when rendered."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from tokenfactory.studies.html import GLOSSARY, render_index, write_index
from tokenfactory.studies.report import human, markdown_table, table_problems

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def reports(tmp_path_factory, quick_study):
    root = tmp_path_factory.mktemp("reports")
    for name in ("operating-modes", "feedback-oscillation"):
        # the session's quick run of each (the studies' own tests read the same), copied: the
        # index is written beside them
        shutil.copytree(quick_study(name), root / name)
    write_index(root, order=["operating-modes", "feedback-oscillation"])
    return root


def _browser():
    if CHROMIUM is None:
        if os.environ.get("TOKENFACTORY_REQUIRE_BROWSER") == "1":
            pytest.fail("Chromium is required here (.ci/run installs Debian's chromium) but was not found")
        pytest.skip("no Chromium on this machine (install Debian's chromium; CI does)")
    from playwright.sync_api import sync_playwright

    return sync_playwright()


def _open(root: Path, shot: Path | None = None, page_name: str = "index.html") -> dict:
    with _browser() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        page = b.new_page(viewport={"width": 1366, "height": 900})
        console = []
        page.on("console", lambda m: console.append((m.type, m.text)))
        page.on("pageerror", lambda e: console.append(("pageerror", str(e))))
        page.goto((root / page_name).as_uri(), wait_until="load")
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = true)")
        page.wait_for_function("Array.from(document.images).every(i => i.complete)", timeout=30_000)
        page.evaluate("document.querySelectorAll('details').forEach(d => d.open = false)")
        page.evaluate("window.scrollTo(0, 0)")
        info = page.evaluate("""() => ({
            images: Array.from(document.images).map(i => ({src: i.getAttribute('src').slice(0, 30), w: i.naturalWidth})),
            csv: Array.from(document.querySelectorAll('a')).map(a => a.getAttribute('href'))
                      .filter(h => h.endsWith('.csv') || h.endsWith('.json')),
            terms: Array.from(document.querySelectorAll('a.term')).map(a => a.getAttribute('href')),
            anchors: Array.from(document.querySelectorAll('[id]')).map(e => e.id),
            sections: document.querySelectorAll('section.study').length,
            overflow: document.documentElement.scrollWidth - window.innerWidth,
            first_screen: Array.from(document.querySelectorAll('section.answers tr, section.answers h3'))
                          .filter(e => e.getBoundingClientRect().bottom <= window.innerHeight)
                          .map(e => e.innerText),
        })""")
        if shot is not None:
            page.screenshot(path=str(shot), full_page=False)
        b.close()
    info["console"] = console
    return info


@pytest.fixture(scope="module")
def rendered(reports, tmp_path_factory):
    """The index opened once in Chromium (with a screenshot) for the tests that read that page."""
    shot = tmp_path_factory.mktemp("shot") / "report.png"
    return _open(reports, shot), shot


def test_page_renders_in_headless_chromium(reports, rendered):
    info, shot = rendered
    errors = [c for c in info["console"] if c[0] in ("error", "pageerror")]
    assert not errors, errors
    assert info["sections"] == 2
    broken = [i["src"] for i in info["images"] if i["w"] == 0]
    assert not broken, f"images that did not resolve: {broken}"
    expected = sum(len(json.loads((reports / s / "metrics.json").read_text())["report"]["figures"])
                   for s in ("operating-modes", "feedback-oscillation"))
    assert len(info["images"]) == expected >= 8
    assert all(i["src"].startswith("data:image/png;base64,") for i in info["images"])
    for href in info["csv"]:
        assert (reports / href).is_file(), href
    for href in info["terms"]:    # every glossary link lands on its entry
        assert href.startswith("#g-") and href[1:] in info["anchors"], href
    assert {"#g-gm", "#g-pm", "#g-dm"} <= set(info["terms"])
    assert info["overflow"] <= 0, "the page scrolls sideways on a laptop-width window"
    assert shot.stat().st_size > 20_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_first_screen_states_each_loops_verdict_and_margins(reports, rendered):
    info, _ = rendered
    m = json.loads((reports / "feedback-oscillation" / "metrics.json").read_text())
    screen = "\n".join(info["first_screen"])
    for lp in m["report"]["loops"]:
        row = next(r for r in info["first_screen"] if r.startswith(lp["loop"]))
        assert ("oscillates" in row) == bool(lp["oscillates"]), row
        if lp["gain_margin"] is not None:
            assert human(lp["gain_margin"]) in row and human(lp["phase_margin_deg"]) + " deg" in row, row
    assert "Does each loop oscillate?" in screen


def test_the_page_alone_shows_every_figure(reports, tmp_path):
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(reports / "index.html", alone / "index.html")   # nothing else travels with it
    info = _open(alone)
    assert info["images"] and all(i["w"] > 0 for i in info["images"])
    assert not [c for c in info["console"] if c[0] in ("error", "pageerror")]


def test_screenshot_of_the_first_screen_for_the_docs():
    # docs/img/report_first_screen.png (shown in the README, looked at by a person) is the first
    # screen of a whole report: TOKENFACTORY_DOCS_REPORT=reports refreshes it from that folder
    src = os.environ.get("TOKENFACTORY_DOCS_REPORT")
    if not src:
        pytest.skip("set TOKENFACTORY_DOCS_REPORT=<reports folder> to refresh docs/img/report_first_screen.png")
    shot = Path(__file__).resolve().parents[1] / "docs" / "img" / "report_first_screen.png"
    info = _open(Path(src), shot)
    assert not [c for c in info["console"] if c[0] in ("error", "pageerror")]
    assert any("Does each loop oscillate?" in t for t in info["first_screen"])


def test_page_carries_results_config_and_provenance(reports):
    page = render_index(reports)
    m = json.loads((reports / "feedback-oscillation" / "metrics.json").read_text())
    assert f"GM {m['smoothed']['gain_margin']:.2f}" in re.sub(r"<[^>]+>", "", page)   # the summary, rendered
    for f in m["report"]["figures"]:
        assert f"<b>{f['file']}</b>" in page and f["caption"].split(":")[0].split("(")[0] in re.sub(r"<[^>]+>", "", page)
    assert m["provenance"]["commit"][:12] in page and "Configuration" in page
    assert "<script" not in page and "http://" not in page and "https://" not in page  # self-contained
    assert page.index("id='answers'") < page.index("<section class='study'") < page.index("id='glossary'")
    for anchor, _, _ in GLOSSARY.values():
        assert f"id='g-{anchor}'" in page


@pytest.mark.parametrize("term", ["SIMC", "tau_c", "Ms (peak sensitivity)", "Pade approximation", "Thornhill r",
                                  "Miao-Seborg R", "describing function", "gain margin (GM)", "phase margin (PM)",
                                  "delay margin (DM)", "Nyquist criterion", "Forsman-Stattin h", "Hagglund detector"])
def test_glossary_explains_every_term(term):
    anchor, text, rx = GLOSSARY[term]
    assert len(text.split()) >= 8 and text.endswith(".")
    assert re.search(rx, term.split(" (")[0]) or re.search(rx, term), (term, rx)


@pytest.mark.parametrize("value,text", [
    (8390641.77, "8,390,642"), (3.24e-60, "< 0.0001"), (-3e-9, "> -0.0001"), (0.000643, "0.000643"), (0.0, "0"), (999.7, "1,000"),
    (12.345, "12.3"), (0.01234, "0.0123"), (True, "yes"), (None, "-"), (float("nan"), "-"), (1234, "1,234"),
    ({"a": 0.5, "b": 2}, "a 0.5, b 2"),
])
def test_numbers_are_formatted_for_people(value, text):
    assert human(value) == text


def test_each_study_summary_keeps_its_table_columns(reports):
    for study in ("operating-modes", "feedback-oscillation"):
        assert table_problems((reports / study / "summary.md").read_text()) == [], study


def test_table_check_sees_a_bullet_under_a_table_and_a_short_row():
    md = "\n".join(markdown_table([{"a": 1, "b": 2.5}], ["a", "b"])[:-1] + ["- a bullet glued to the table"])
    assert any("renders as a table row" in p for p in table_problems(md))
    assert any("3 cells under a 2-column header" in p for p in table_problems("| a | b |\n|---|---|\n| 1 | 2 | 3 |"))
    assert table_problems("\n".join(markdown_table([{"a": 1, "b": "x|y"}], ["a", "b"]) + ["- fine"])) == []
