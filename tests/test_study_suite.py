"""The study suite runner: variants (quick / default / full), longest-first order from the last
reports, studies in parallel processes, the HTML index over the results."""

import json
import sys
import textwrap

import pytest

from tokenfactory import studies
from tokenfactory.cli import main
from tokenfactory.studies import has_full_variant, run_study, suite_order
from tokenfactory.core.validation import ConfigError

FAKE = textwrap.dedent('''
    from pathlib import Path
    from tokenfactory.studies.report import StudyReport

    def run(out_dir, quick=False, config=None{full_param}):
        variant = "quick" if quick else {variant_expr}
        report = StudyReport("{name}", Path(out_dir), {{"variant": variant}})
        report.headline("variant", variant)
        return report.finish({{"variant": variant}}, ["Ran the " + variant + " variant."])
''')


@pytest.fixture
def fake_studies(tmp_path, monkeypatch):
    """Two tiny studies: ``fake-a`` has a full variant, ``fake-b`` does not."""
    pkg = tmp_path / "fakepkg"
    pkg.mkdir()
    (pkg / "fake_a.py").write_text(FAKE.format(name="fake-a", full_param=", full=False",
                                               variant_expr='"full" if full else "default"'))
    (pkg / "fake_b.py").write_text(FAKE.format(name="fake-b", full_param="", variant_expr='"default"'))
    monkeypatch.syspath_prepend(str(pkg))
    monkeypatch.setattr(studies, "STUDIES", {"fake-a": "fake_a", "fake-b": "fake_b"})
    yield tmp_path
    for m in ("fake_a", "fake_b"):
        sys.modules.pop(m, None)


def _variant(path):
    return json.loads((path / "metrics.json").read_text())["variant"]


def test_variants(fake_studies):
    out = fake_studies / "r"
    assert has_full_variant("fake-a") and not has_full_variant("fake-b")
    assert run_study("fake-a", out / "a", full=True)["variant"] == "full"
    assert run_study("fake-a", out / "a", quick=True)["variant"] == "quick"
    assert run_study("fake-a", out / "a")["variant"] == "default"
    assert run_study("fake-b", out / "b", full=True)["variant"] == "default"  # no heavier grid: its default
    with pytest.raises(ConfigError, match="exclusive"):
        run_study("fake-a", out / "a", quick=True, full=True)


def test_suite_order_is_longest_first_from_the_last_reports(tmp_path):
    names = ["s1", "s2", "s3", "s4"]
    for n, wall in (("s2", 5.0), ("s3", 50.0)):
        (tmp_path / n).mkdir()
        (tmp_path / n / "metrics.json").write_text(json.dumps({"provenance": {"wall_seconds": wall}}))
    (tmp_path / "s4").mkdir()
    (tmp_path / "s4" / "metrics.json").write_text("{not json")
    assert suite_order(names, tmp_path) == ["s3", "s2", "s1", "s4"]
    assert suite_order(names, tmp_path / "missing") == names


def test_first_run_order_comes_from_typical_times(tmp_path, monkeypatch):
    from tokenfactory import studies as st

    monkeypatch.setattr(st, "TYPICAL_SECONDS", {"b": 10.0, "c": 99.0})
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "metrics.json").write_text(json.dumps({"provenance": {"wall_seconds": 50.0}}))
    # a report beats the typical time; studies in neither go last, in their order
    assert suite_order(["d", "a", "b", "c"], tmp_path) == ["c", "a", "b", "d"]


def test_every_study_has_a_typical_time():
    # a study missing here would run last on a first `make run`, whatever its length
    assert set(studies.TYPICAL_SECONDS) == set(studies.STUDIES)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_study_all_runs_every_study_and_writes_the_index(fake_studies, capsys, jobs):
    out = fake_studies / "reports"
    assert main(["study", "all", "--full", "--jobs", jobs, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert _variant(out / "fake-a") == "full" and _variant(out / "fake-b") == "default"
    assert "[1/2]" in text and "[2/2]" in text and f"on {jobs} process" in text
    assert (out / "index.html").read_text().count("Ran the") == 2


def test_study_rejects_quick_with_full(fake_studies, capsys):
    assert main(["study", "fake-a", "--quick", "--full", "--out", str(fake_studies / "x")]) == 2
    assert "exclusive" in capsys.readouterr().err


def test_quick_writes_beside_the_default_report_and_prints_the_answer(fake_studies, capsys, monkeypatch):
    monkeypatch.chdir(fake_studies)
    assert main(["study", "fake-a", "--quick"]) == 0
    out = capsys.readouterr().out
    assert _variant(fake_studies / "reports-quick" / "fake-a") == "quick"
    assert not (fake_studies / "reports").exists()          # the make-run report is untouched
    assert "fake-a (quick variant) -> reports-quick/fake-a/" in out.splitlines()[0]
    assert "    variant: quick" in out                        # the study's headline, printed
    assert (fake_studies / "reports-quick" / "index.html").is_file()
    assert main(["study", "fake-a"]) == 0
    assert _variant(fake_studies / "reports" / "fake-a") == "default"
    assert _variant(fake_studies / "reports-quick" / "fake-a") == "quick"


def test_the_default_suite_leaves_out_on_demand_studies():
    from tokenfactory import studies

    suite = studies.default_suite()
    assert "live" in studies.STUDIES and "live" not in suite
    assert [n for n in studies.STUDIES if n not in studies.ON_DEMAND] == suite
