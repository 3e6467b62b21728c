"""The HTML report: one page, ``reports/index.html``, over every study folder under ``reports/``.

Each study section shows its headline figures, its summary (rendered from ``summary.md``, whose
outcome sentences are generated from the run's numbers), its figures with what they show, previews
of its tables with links to the CSVs, and its configuration and provenance (commit, seeds in the
config, package versions). The page is self-contained: inline CSS, no scripts from the network;
images and CSVs are relative links into the study folders, so the ``reports/`` folder can be moved
or zipped as a whole. ``tokenfactory report [DIR]`` rebuilds it; ``make run`` writes it.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from pathlib import Path
from typing import Any

import markdown
import pandas as pd

from tokenfactory.studies.report import provenance

__all__ = ["write_index", "render_index"]

_PREVIEW_ROWS, _PREVIEW_COLS = 12, 14

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#dde2ea; --accent:#2457c5; --bg:#fbfcfe; --card:#fff; }
* { box-sizing: border-box; }
body { margin:0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:var(--fg);
       background:var(--bg); }
header { padding: 18px 28px; border-bottom: 1px solid var(--line); background: var(--card); }
header h1 { margin: 0 0 4px; font-size: 22px; }
header p { margin: 2px 0; color: var(--muted); font-size: 13px; }
.layout { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; width: 220px; flex: none; padding: 18px 12px 18px 28px; font-size: 14px;
      max-height: 100vh; overflow-y: auto; }
nav a { display: block; padding: 4px 0; color: var(--accent); text-decoration: none; }
nav a:hover { text-decoration: underline; }
main { flex: 1; min-width: 0; max-width: 1180px; padding: 8px 28px 60px 8px; }
section.study { background: var(--card); border: 1px solid var(--line); border-radius: 8px; padding: 6px 22px 18px;
                margin: 18px 0; }
section.study > h2 { margin-top: 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0 14px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 150px; max-width: 260px; }
.card .v { font-size: 19px; font-weight: 600; }
.card .l { font-size: 12px; color: var(--muted); }
.card .n { font-size: 11px; color: var(--muted); }
figure { margin: 16px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
figcaption { font-size: 13px; color: var(--muted); margin-top: 4px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; display: block; overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: right; white-space: nowrap; }
th { background: #f2f4f8; }
td:first-child, th:first-child { text-align: left; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--accent); }
pre { background: #f5f7fa; border: 1px solid var(--line); padding: 10px; overflow-x: auto; font-size: 12px; }
code { font-size: 90%; }
.muted { color: var(--muted); font-size: 13px; }
"""


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if not math.isfinite(v):
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else str(v)


def _table_preview(path: Path) -> str:
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return "<p class='muted'>(could not be read)</p>"
    shown = df.iloc[:_PREVIEW_ROWS, :_PREVIEW_COLS]
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(v.item() if hasattr(v, 'item') else v))}</td>"
                                    for v in r) + "</tr>" for r in shown.itertuples(index=False))
    more = []
    if len(df) > _PREVIEW_ROWS:
        more.append(f"{len(df) - _PREVIEW_ROWS} more rows")
    if df.shape[1] > _PREVIEW_COLS:
        more.append(f"{df.shape[1] - _PREVIEW_COLS} more columns")
    note = f"<p class='muted'>{', '.join(more)} in the CSV.</p>" if more else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{note}"


def _summary_html(study_dir: Path) -> str:
    path = study_dir / "summary.md"
    if not path.is_file():
        return ""
    text = path.read_text()
    text = text.split("\n## Figures", 1)[0]          # figures are laid out from metrics.json below
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):           # the section has its own title
        lines = lines[1:]
    body = markdown.markdown("\n".join(lines), extensions=["tables"])
    # the summary's own headings sit under the study's <h2>
    return body.replace("<h3>", "<h4>").replace("</h3>", "</h4>").replace("<h2>", "<h3>").replace("</h2>", "</h3>")


def _study_section(study_dir: Path, metrics: dict) -> str:
    name = metrics.get("study", study_dir.name)
    rel = study_dir.name
    rep = metrics.get("report", {})
    prov = metrics.get("provenance", {})
    out = [f"<section class='study' id='{html.escape(rel)}'>", f"<h2>{html.escape(name)}</h2>"]
    wall = prov.get("wall_seconds")
    out.append(f"<p class='muted'>Folder <a href='{html.escape(rel)}/'>{html.escape(rel)}/</a>"
               + (f"; ran in {wall:.1f} s" if isinstance(wall, (int, float)) else "")
               + (f"; commit <code>{html.escape(str(prov.get('commit', 'unknown'))[:12])}</code>" if prov else "")
               + ".</p>")
    heads = rep.get("headlines", [])
    if heads:
        out.append("<div class='cards'>")
        for h in heads:
            out.append(f"<div class='card'><div class='v'>{html.escape(_fmt(h.get('value')))}"
                       f"{(' ' + html.escape(h['unit'])) if h.get('unit') else ''}</div>"
                       f"<div class='l'>{html.escape(h.get('label', ''))}</div>"
                       + (f"<div class='n'>{html.escape(h['note'])}</div>" if h.get("note") else "") + "</div>")
        out.append("</div>")
    out.append(_summary_html(study_dir))
    figures = rep.get("figures") or [{"file": p.name, "caption": ""} for p in sorted(study_dir.glob("*.png"))]
    for f in figures:
        src = f"{rel}/{f['file']}"
        out.append(f"<figure><img src='{html.escape(src)}' alt='{html.escape(f['caption'] or f['file'])}' "
                   f"loading='lazy'><figcaption><b>{html.escape(f['file'])}</b>: {html.escape(f['caption'])}"
                   "</figcaption></figure>")
    tables = rep.get("tables") or [{"file": p.name, "caption": ""} for p in sorted(study_dir.glob("*.csv"))]
    if tables:
        out.append("<h3>Tables</h3>")
        for t in tables:
            href = f"{rel}/{t['file']}"
            out.append(f"<details><summary>{html.escape(t['file'])}"
                       + (f" - {html.escape(t['caption'])}" if t.get("caption") else "")
                       + f"</summary><p><a href='{html.escape(href)}'>download CSV</a></p>"
                       + _table_preview(study_dir / t["file"]) + "</details>")
    cfg = json.dumps(metrics.get("config", {}), indent=2, sort_keys=True)
    out.append(f"<details><summary>Configuration</summary><pre>{html.escape(cfg)}</pre></details>")
    out.append(f"<details><summary>Provenance</summary><pre>{html.escape(json.dumps(prov, indent=2))}</pre>"
               f"<p><a href='{html.escape(rel)}/metrics.json'>metrics.json</a> (every figure of the run)</p>"
               "</details>")
    out.append("</section>")
    return "\n".join(out)


def render_index(reports_dir: str | Path, order: list[str] | None = None) -> str:
    """The HTML of the report over every study folder (one with a ``metrics.json``) in ``reports_dir``.

    Parameters
    ----------
    reports_dir : str or Path
        The folder holding one sub-folder per study.
    order : list of str, optional
        Study folder names in the order to show them; others follow alphabetically (names
        without a folder are skipped).

    Returns
    -------
    str
        The page: headline cards, rendered summary, figures, table previews (first 12 rows and
        14 columns), configuration and provenance of each study. A folder whose
        ``metrics.json`` cannot be read or parsed is left out.
    """
    root = Path(reports_dir)
    found = {p.parent.name: p.parent for p in sorted(root.glob("*/metrics.json"))}
    names = [n for n in (order or []) if n in found] + sorted(n for n in found if n not in (order or []))
    sections, nav = [], []
    for n in names:
        try:
            metrics = json.loads((found[n] / "metrics.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        sections.append(_study_section(found[n], metrics))
        nav.append(f"<a href='#{html.escape(n)}'>{html.escape(metrics.get('study', n))}</a>")
    prov = provenance()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v)
    body = "\n".join(sections) or "<p>No study reports found in this folder.</p>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tokenfactory report</title>
<style>{_CSS}</style></head>
<body>
<header><h1>tokenfactory report</h1>
<p>{len(sections)} studies; page built {stamp} from commit <code>{html.escape(prov['commit'])}</code>,
tokenfactory {html.escape(prov['tokenfactory'])}, Python {html.escape(prov['python'])}.</p>
<p>{html.escape(versions)}</p></header>
<div class="layout"><nav>{''.join(nav)}</nav>
<main>{body}</main></div>
</body></html>
"""


def write_index(reports_dir: str | Path, order: list[str] | None = None) -> Path:
    """Write ``index.html`` into ``reports_dir`` (see :func:`render_index`).

    Parameters
    ----------
    reports_dir : str or Path
        The folder holding one sub-folder per study (created if missing).
    order : list of str, optional
        Study folder names in display order; others follow alphabetically.

    Returns
    -------
    Path
        The written file.
    """
    root = Path(reports_dir)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "index.html"
    path.write_text(render_index(root, order))
    return path
