"""Full-size study variants (``pytest -m slow``; ``--full`` on the CLI); the default test run uses
the quick variants, ``make run`` the default ones."""

import json
import re

import pytest

from tokenfactory.studies import STUDIES, run_study


@pytest.mark.slow
@pytest.mark.parametrize("name", list(STUDIES))
def test_full_study_runs(name, tmp_path):
    run_study(name, tmp_path, full=True)
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["study"] == name
    summary = (tmp_path / "summary.md").read_text()
    assert not re.search(r"\bnan\b", summary, re.IGNORECASE)  # every sentence had its numbers
    for fig in m["report"]["figures"]:  # every figure listed was written, with its caption
        assert (tmp_path / fig["file"]).stat().st_size > 10_000 and fig["caption"]
    for table in m["report"]["tables"]:
        assert (tmp_path / table["file"]).stat().st_size > 0
