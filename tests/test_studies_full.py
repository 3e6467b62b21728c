"""Full-size study variants (``pytest -m slow``); the default run uses the quick variants."""

import json

import pytest

from tokenfactory.studies import STUDIES, run_study


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_full_study_runs(name, tmp_path):
    run_study(name, tmp_path, quick=False)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["study"] == name and (tmp_path / "summary.md").stat().st_size > 0
