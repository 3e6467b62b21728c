"""The HTML report: one page, ``reports/index.html``, over every study folder under ``reports/``.

The page opens with the answers a capacity engineer came for, collected from the studies'
``metrics.json`` (``report.loops``: does each feedback loop oscillate and its margins;
``report.answers``: what limits capacity and what to change - each sentence generated from that
run's numbers), then one section per study: its headline cards, its first figures, and, collapsed,
its summary (rendered from ``summary.md``), its other figures, previews of its tables, its
configuration and provenance. A glossary at the end says in a plain sentence what every
control-theory term and detector means; the terms are linked from where they are used. Numbers are
formatted for people (:func:`tokenfactory.studies.report.human`). The page is self-contained: inline
CSS, no scripts, every figure embedded as a data URI, so ``index.html`` alone shows everything; the
"download CSV" and ``metrics.json`` links point into the study folders beside it.
``tokenfactory report [DIR]`` rebuilds it; ``make run`` writes it.
"""

from __future__ import annotations

import base64
import datetime as _dt
import html
import json
import re
from pathlib import Path
from typing import Any

import markdown
import pandas as pd

from tokenfactory.studies.report import human, provenance

__all__ = ["write_index", "render_index", "GLOSSARY"]

_PREVIEW_ROWS, _PREVIEW_COLS = 12, 14
_FIGURES_SHOWN = 2   # per study, above the fold of its section; the rest are collapsed

#: term -> (anchor, plain sentence, regular expression of its uses in the text).
GLOSSARY: dict[str, tuple[str, str, str]] = {
    "gain margin (GM)": ("gm", "How many times the loop's gain could grow before it starts to oscillate; "
                         "2 means it tolerates a plant twice as sensitive as modelled.",
                         r"\bGM\b|\bgain margins?\b"),
    "phase margin (PM)": ("pm", "How much extra phase lag (in degrees) the loop tolerates at the frequency where its "
                          "gain is 1 before it oscillates; 45-60 deg is comfortable, near 0 rings.",
                          r"\bPM\b|\bphase margins?\b"),
    "delay margin (DM)": ("dm", "How many extra seconds of delay (a slower measurement, a later transfer) the loop "
                          "tolerates before it oscillates.", r"\bDM\b|\bdelay margins?\b"),
    "Ms (peak sensitivity)": ("ms", "The largest factor by which the loop amplifies a disturbance at any frequency; "
                              "under 2 is robust, large values mean a loop close to oscillating.",
                              r"\bMs\b"),
    "SIMC": ("simc", "Skogestad's tuning rule: PI gains from the plant's gain and delay, with one knob (tau_c) "
             "trading speed for robustness.", r"\bSIMC\b"),
    "tau_c": ("tau-c", "SIMC's closed-loop time constant: how fast the tuned loop is asked to respond; larger "
              "(in multiples of the delay theta) is slower and more robust.", r"\btau_c\b"),
    "theta (effective delay)": ("theta", "The loop's dead time: everything between a controller acting and it "
                                "seeing the effect (measurement delay, fill-to-ready time, half a sample).",
                                r"\btheta\b"),
    "Pade approximation": ("pade", "A rational function that imitates a pure delay so linear tools can handle it; "
                           "its order is checked against the exact delay here.", r"\bPad[eé]\b"),
    "Nyquist criterion": ("nyquist", "The stability test used for every verdict: count how often the loop's "
                          "frequency response circles -1; the closed loop is stable when the count matches the "
                          "open-loop unstable poles.", r"\bNyquist\b"),
    "right-half-plane poles": ("rhp", "Modes of a system that grow without bound; a stable closed loop has none.",
                               r"\bright-half-plane poles?\b"),
    "describing function": ("df", "An approximation of a nonlinearity (on/off relay, saturation, dead band) by "
                            "its gain on a sine wave; where it balances the loop, a limit cycle of predicted period "
                            "and amplitude exists.", r"\bdescribing[- ]functions?\b|\bDF\b"),
    "limit cycle": ("limit-cycle", "A self-sustained oscillation of fixed period and amplitude, produced by the "
                    "loop itself rather than by the demand.", r"\blimit[- ]cycles?\b"),
    "first harmonic": ("harmonic", "The sine wave at the oscillation's own period that best fits the signal; its "
                       "amplitude is what the describing function predicts.", r"\bfirst[- ]harmonic\b"),
    "Thornhill r": ("thornhill", "How regularly the zero crossings of the signal's autocorrelation are spaced "
                    "(Thornhill, Huang and Zhang 2003: mean period over three standard deviations); r > 1 means a "
                    "regular oscillation, not noise.", r"\bThornhill\b"),
    "Miao-Seborg R": ("miao-seborg", "How strongly the signal's autocorrelation rebounds after its first dip "
                      "(Miao and Seborg 1999); R > 0.5 flags an excessively oscillatory loop.", r"\bMiao-Seborg\b"),
    "Forsman-Stattin h": ("forsman", "Share of consecutive half-waves of the signal with similar area and "
                          "duration (Forsman and Stattin 1999); h > 0.4 indicates an oscillation, white noise "
                          "gives about 0.1.", r"\bForsman-Stattin\b"),
    "Hagglund detector": ("hagglund", "Counts load disturbances - stretches between zero crossings whose "
                          "integrated error exceeds a limit set by the acceptable amplitude (Hagglund 1995); more "
                          "than 10 in 50 periods raise a limit-cycle alarm.", r"\bH[aä]gglund\b"),
    "spectral peak": ("spectral", "Share of the signal's power within +/-20 % of its strongest frequency; "
                      "tokenfactory's own screening index, used only to corroborate the verdict.",
                      r"\bspectral peak\b"),
    "oscillation verdict": ("verdict", "A signal oscillates when its swing reaches the stated amplitude, "
                            "Thornhill r > 1, and Miao-Seborg R > 0.5 or Forsman-Stattin h > 0.4 (regularity "
                            "separates a cycle from noise, the second index a cycle from a decaying transient).",
                            r"\boscillat(?:es|ing)\b"),
    "coherence": ("coherence", "How strongly two signals move together at one frequency: 0 unrelated, 1 locked.",
                  r"\bcoherence\b"),
    "envelope": ("envelope", "The set of plant errors a loop must tolerate (delays and service rates scaled up "
                 "and down); margins are reported at its worst point.", r"\benvelope\b"),
    "separation ratio": ("separation", "How much faster an inner loop is than the loop around it (bandwidth "
                         "ratio); large ratios let each layer be tuned as if the other were ideal.",
                         r"\bseparation\b"),
    "hysteresis and dead band": ("hysteresis", "A gap between the thresholds for scaling up and down, so noise "
                                 "around one level does not move workers back and forth.",
                                 r"\bhysteretic\b|\bhysteresis\b|\bdead band\b"),
    "reversals per hour": ("reversals", "Scale actions that undo the direction of the previous one: churn, "
                           "regular or not.", r"\breversals\b"),
    "SLO": ("slo", "Service-level objective: here time to first token (TTFT) and time per output token (TPOT) "
            "limits per request class.", r"\bSLOs?\b"),
    "TTFT": ("ttft", "Time to first token: from a request's arrival to its first output token.", r"\bTTFT\b"),
    "TPOT": ("tpot", "Time per output token after the first: one decode pass of the batch the request is in.",
             r"\bTPOT\b"),
    "goodput": ("goodput", "Output tokens per second of requests that met their SLO; what the capacity is worth.",
                r"\bgoodput\b"),
    "SLO attainment": ("attainment", "Share of requests meeting their class's SLO (rejected ones count as misses "
                       "unless stated as 'admitted').", r"\bSLO attainment\b"),
    "batch cap": ("batch-cap", "The most sequences a decode worker runs at once; vLLM's --max-num-seqs.",
                  r"\bbatch cap\b"),
    "roofline": ("roofline", "A pass takes the longest of its compute, memory and network times at the "
                 "hardware's (fitted) efficiencies.", r"\broofline\b"),
    "oracle": ("oracle", "The fewest GPU-hours any plan could use, knowing the future demand exactly; a floor, "
               "not a controller.", r"\boracle\b"),
    "synthetic stand-in": ("synthetic", "The embedded synthetic workload, run in place of a public trace that is "
                           "not on this machine (`tokenfactory traces fetch` gets them).",
                           r"\bsynthetic stand-in\b"),
}

_CSS = """
:root { --fg:#1d2330; --muted:#5b6475; --line:#dde2ea; --accent:#2457c5; --bg:#fbfcfe; --card:#fff;
        --ok:#1a7f37; --bad:#b42318; }
* { box-sizing: border-box; }
body { margin:0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color:var(--fg);
       background:var(--bg); }
header { padding: 12px 28px; border-bottom: 1px solid var(--line); background: var(--card); }
header h1 { margin: 0 0 2px; font-size: 21px; }
header p { margin: 1px 0; color: var(--muted); font-size: 12px; }
.layout { display: flex; align-items: flex-start; }
nav { position: sticky; top: 0; width: 200px; flex: none; padding: 14px 10px 18px 24px; font-size: 13.5px;
      max-height: 100vh; overflow-y: auto; }
nav a { display: block; padding: 3px 0; color: var(--accent); text-decoration: none; }
nav a:hover { text-decoration: underline; }
nav .sep { border-top: 1px solid var(--line); margin: 6px 0; }
main { flex: 1; min-width: 0; max-width: 1180px; padding: 8px 28px 60px 8px; }
section.study, section.answers, section.glossary { background: var(--card); border: 1px solid var(--line);
    border-radius: 8px; padding: 4px 22px 16px; margin: 14px 0; }
section.answers { border-color: #b8c6e6; }
section.answers h2 { margin: 10px 0 6px; font-size: 19px; }
section.answers h3 { margin: 12px 0 4px; font-size: 15px; }
section.answers ul { margin: 4px 0; padding-left: 20px; }
section.study > h2 { margin-top: 12px; margin-bottom: 4px; }
.yes { color: var(--bad); font-weight: 600; } .no { color: var(--ok); font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 10px 0 14px; }
.card { border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px; min-width: 150px; max-width: 270px; }
.card .v { font-size: 19px; font-weight: 600; }
.card .l { font-size: 12px; color: var(--muted); }
.card .n { font-size: 11px; color: var(--muted); }
figure { margin: 14px 0; }
figure img { max-width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
figcaption { font-size: 13px; color: var(--muted); margin-top: 4px; }
table { border-collapse: collapse; font-size: 12.5px; margin: 8px 0; display: block; overflow-x: auto; max-width: 100%; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: right; }
td { white-space: nowrap; }
th { background: #f2f4f8; white-space: normal; min-width: 4em; max-width: 11em; vertical-align: bottom; }
td:first-child, th:first-child, td.t { text-align: left; }
table.loops { font-size: 12.5px; }
table.loops td { white-space: normal; padding: 2px 7px; }
table.loops td:first-child { min-width: 16em; }
table.loops td:nth-child(n+2):nth-child(-n+6) { white-space: nowrap; }
table.loops td:nth-child(n+6), table.loops th:nth-child(n+6) { text-align: left; }
table.loops td:nth-child(7) { font-size: 11.5px; color: var(--muted); }
p.verdict { font-size: 15.5px; margin: 6px 0 4px; }
footer { padding: 8px 28px 24px; color: var(--muted); font-size: 12px; }
details { margin: 8px 0; }
summary { cursor: pointer; color: var(--accent); }
pre { background: #f5f7fa; border: 1px solid var(--line); padding: 10px; overflow-x: auto; font-size: 12px; }
code { font-size: 90%; }
a.term { color: inherit; text-decoration: underline dotted #8a94a8; }
dl.glossary dt { font-weight: 600; margin-top: 8px; }
dl.glossary dd { margin: 2px 0 0 16px; }
.muted { color: var(--muted); font-size: 13px; }
.notice { background: #fff8e6; border: 1px solid #f0d48a; border-radius: 6px; padding: 6px 10px; font-size: 13.5px; }
"""

# longer patterns first, so "SLO attainment" links as itself rather than as "SLO"
_TERM_RE = [(re.compile(rx), anchor) for _, (anchor, _, rx) in sorted(GLOSSARY.items(), key=lambda kv: -len(kv[1][2]))]


def _link_terms(fragment: str) -> str:
    """Link the glossary's terms in an HTML fragment: the first use of each term per fragment, in
    text only (never inside a tag, a link, code or a heading)."""
    seen: set[str] = set()
    out, skip = [], 0
    for part in re.split(r"(<[^>]+>)", fragment):
        if part.startswith("<"):
            tag = re.match(r"</?\s*([a-zA-Z0-9]+)", part)
            name = tag.group(1).lower() if tag else ""
            if name in ("a", "code", "pre", "h2", "h3", "h4", "summary", "th"):
                skip += -1 if part.startswith("</") else 1
                skip = max(skip, 0)
            out.append(part)
            continue
        if skip or not part.strip():
            out.append(part)
            continue
        spans: list[tuple[int, int, str]] = []   # non-overlapping matches on the original text
        for rx, anchor in _TERM_RE:
            if anchor in seen:
                continue
            for m in rx.finditer(part):
                if all(m.end() <= a or m.start() >= b for a, b, _ in spans):
                    spans.append((m.start(), m.end(), anchor))
                    seen.add(anchor)   # one link per term per fragment; later uses stay plain
                    break
        pos, pieces = 0, []
        for a, b, anchor in sorted(spans):
            pieces += [part[pos:a], f"<a class='term' href='#g-{anchor}'>{part[a:b]}</a>"]
            pos = b
        out.append("".join(pieces) + part[pos:])
    return "".join(out)


def _fmt(v: Any) -> str:
    return human(v)


def _data_uri(path: Path) -> str | None:
    try:
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")
    except OSError:
        return None


def _table_preview(path: Path) -> str:
    try:
        df = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.EmptyDataError):
        return "<p class='muted'>(could not be read)</p>"
    shown = df.iloc[:_PREVIEW_ROWS, :_PREVIEW_COLS]
    head = "".join(f"<th>{html.escape(str(c).replace('_', ' '))}</th>" for c in shown.columns)
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
    body = body.replace("<h3>", "<h4>").replace("</h3>", "</h4>").replace("<h2>", "<h3>").replace("</h2>", "</h3>")
    # words read from the left, numbers from the right
    body = re.sub(r"<td>(?!\s*(?:[-+]|&lt;|&gt;)?\s*[\d.,]+\s*(?:[%x]|s|deg)?\s*</td>)(?!-</td>)", "<td class='t'>", body)
    return _link_terms(body)


def _figure(study_dir: Path, f: dict) -> str:
    src = _data_uri(study_dir / f["file"])
    if src is None:
        return (f"<p class='muted'>Figure <b>{html.escape(f['file'])}</b> is missing from "
                f"{html.escape(study_dir.name)}/.</p>")
    return (f"<figure><img src='{src}' alt='{html.escape(f['caption'] or f['file'])}'>"
            f"<figcaption><b>{html.escape(f['file'])}</b>: {_link_terms(html.escape(f['caption']))}"
            "</figcaption></figure>")


def _study_section(study_dir: Path, metrics: dict) -> str:
    name = metrics.get("study", study_dir.name)
    rel = study_dir.name
    rep = metrics.get("report", {})
    prov = metrics.get("provenance", {})
    out = [f"<section class='study' id='{html.escape(rel)}'>", f"<h2>{html.escape(name)}</h2>"]
    wall = prov.get("wall_seconds")
    variant = (metrics.get("config") or {}).get("quick")
    out.append(f"<p class='muted'>Folder <a href='{html.escape(rel)}/'>{html.escape(rel)}/</a>"
               + (" (quick variant)" if variant is True else "")
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
    figures = rep.get("figures") or [{"file": p.name, "caption": ""} for p in sorted(study_dir.glob("*.png"))]
    out += [_figure(study_dir, f) for f in figures[:_FIGURES_SHOWN]]
    summary = _summary_html(study_dir)
    if summary:
        out.append(f"<details><summary>Summary: what the run found, in numbers and tables</summary>{summary}</details>")
    if len(figures) > _FIGURES_SHOWN:
        out.append(f"<details><summary>{len(figures) - _FIGURES_SHOWN} more figures</summary>"
                   + "".join(_figure(study_dir, f) for f in figures[_FIGURES_SHOWN:]) + "</details>")
    tables = rep.get("tables") or [{"file": p.name, "caption": ""} for p in sorted(study_dir.glob("*.csv"))]
    if tables:
        parts = []
        for t in tables:
            href = f"{rel}/{t['file']}"
            parts.append(f"<details><summary>{html.escape(t['file'])}"
                         + (f" - {html.escape(t['caption'])}" if t.get("caption") else "")
                         + f"</summary><p><a href='{html.escape(href)}'>download CSV</a> (in the study folder)</p>"
                         + _table_preview(study_dir / t["file"]) + "</details>")
        out.append(f"<details><summary>{len(tables)} data tables (CSV previews)</summary>{''.join(parts)}</details>")
    cfg = json.dumps(metrics.get("config", {}), indent=2, sort_keys=True)
    out.append(f"<details><summary>Configuration</summary><pre>{html.escape(cfg)}</pre></details>")
    out.append(f"<details><summary>Provenance</summary><pre>{html.escape(json.dumps(prov, indent=2))}</pre>"
               f"<p><a href='{html.escape(rel)}/metrics.json'>metrics.json</a> (every figure of the run)</p>"
               "</details>")
    out.append("</section>")
    return "\n".join(out)


def _margin(v: Any, unit: str = "") -> str:
    return "-" if v is None else html.escape(human(v) + unit)


def _answers_section(studies: list[tuple[str, dict]]) -> str:
    """The opening: every loop's verdict and margins, what limits capacity, what to change, and
    which traces were replaced by the synthetic stand-in - all read from the studies' metrics."""
    loops, capacity, change, absent = [], [], [], {}
    for rel, m in studies:
        rep = m.get("report", {})
        name = m.get("study", rel)
        link = f"<a href='#{html.escape(rel)}'>{html.escape(name)}</a>"
        for lp in rep.get("loops", []):
            loops.append((lp, link))
        for a in rep.get("answers", []):
            (capacity if a["kind"] == "capacity" else change).append((a["text"], link))
        for t in m.get("absent_traces") or []:
            absent.setdefault(t, []).append(link)
    out = ["<section class='answers' id='answers'><h2>The answers</h2>"]
    if absent:
        out.append("<p class='notice'>Not on this machine, so replaced by the <a class='term' href='#g-synthetic'>"
                   "synthetic stand-in</a>: " + "; ".join(f"{html.escape(t)} (in {', '.join(sorted(set(ls)))})"
                                                        for t, ls in absent.items())
                   + ". <code>tokenfactory traces fetch all</code> downloads the public traces.</p>")
    if loops:
        osc = [lp["loop"] for lp, _ in loops if lp["oscillates"]]
        calm = [lp for lp, _ in loops if lp["oscillates"] is False]
        worst_pm = min((lp for lp in calm if lp["phase_margin_deg"] is not None),
                       key=lambda lp: lp["phase_margin_deg"], default=None)
        out.append("<p class='verdict'>"
                   + (f"<b>{len(osc)} of {len(loops)} loops oscillate</b>: {html.escape('; '.join(osc))}. "
                      if osc else f"<b>None of the {len(loops)} loops oscillates.</b> ")
                   + (f"Of the {len(calm)} that do not, the thinnest phase margin is "
                      f"{_margin(worst_pm['phase_margin_deg'], ' deg')} ({html.escape(worst_pm['loop'])}, "
                      f"gain margin {_margin(worst_pm['gain_margin'])}, delay margin "
                      f"{_margin(worst_pm['delay_margin_s'], ' s')})." if worst_pm else "")
                   + "</p>")
        out.append("<h3>Does each loop oscillate? Its margins</h3>")
        rows = []
        for lp, link in loops:
            osc = lp["oscillates"]
            verdict = ("<span class='yes'>oscillates</span>" if osc else
                       "<span class='no'>no</span>" if osc is False else "not simulated")
            rows.append(f"<tr><td>{html.escape(lp['loop'])}</td><td>{verdict}</td>"
                        f"<td>{_margin(lp['gain_margin'])}</td><td>{_margin(lp['phase_margin_deg'], ' deg')}</td>"
                        f"<td>{_margin(lp['delay_margin_s'], ' s')}</td><td>{link}</td>"
                        f"<td>{_link_terms(html.escape(lp['detail']))}</td></tr>")
        out.append("<table class='loops'><thead><tr><th>loop</th><th><a class='term' href='#g-verdict'>oscillates?</a></th>"
                   "<th><a class='term' href='#g-gm'>gain margin</a></th>"
                   "<th><a class='term' href='#g-pm'>phase margin</a></th>"
                   "<th><a class='term' href='#g-dm'>delay margin</a></th><th>study</th><th>evidence</th></tr>"
                   "</thead><tbody>" + "".join(rows) + "</tbody></table>")
    for title, items in (("What limits capacity", capacity), ("What to change", change)):
        if items:
            out.append(f"<h3>{title}</h3><ul>" + "".join(
                f"<li>{_link_terms(html.escape(t))} <span class='muted'>({link})</span></li>" for t, link in items)
                + "</ul>")
    if len(out) == 1:
        out.append("<p class='muted'>These reports carry no loop verdicts or answers (they predate them: rerun "
                   "the studies).</p>")
    out.append("</section>")
    return "\n".join(out)


def _glossary_section() -> str:
    items = "".join(f"<dt id='g-{anchor}'>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>"
                    for term, (anchor, text, _) in GLOSSARY.items())
    return f"<section class='glossary' id='glossary'><h2>Glossary</h2><dl class='glossary'>{items}</dl></section>"


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
        The page: the answers (loop verdicts and margins, capacity limits, changes), then per study
        its headline cards and first figures with the summary, the other figures, table previews
        (first 12 rows and 14 columns), configuration and provenance collapsed; the glossary last.
        Figures are embedded (data URIs). A folder whose ``metrics.json`` cannot be read or parsed
        is left out.
    """
    root = Path(reports_dir)
    found = {p.parent.name: p.parent for p in sorted(root.glob("*/metrics.json"))}
    names = [n for n in (order or []) if n in found] + sorted(n for n in found if n not in (order or []))
    loaded, sections = [], []
    nav = ["<a href='#answers'>The answers</a>", "<div class='sep'></div>"]
    for n in names:
        try:
            metrics = json.loads((found[n] / "metrics.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        loaded.append((n, metrics))
        sections.append(_study_section(found[n], metrics))
        nav.append(f"<a href='#{html.escape(n)}'>{html.escape(metrics.get('study', n))}</a>")
    nav += ["<div class='sep'></div>", "<a href='#glossary'>Glossary</a>"]
    prov = provenance()
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    versions = ", ".join(f"{k} {v}" for k, v in prov["versions"].items() if v)
    body = ("\n".join([_answers_section(loaded), *sections, _glossary_section()]) if sections
            else "<p>No study reports found in this folder.</p>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tokenfactory report</title>
<style>{_CSS}</style></head>
<body>
<header><h1>tokenfactory report</h1>
<p>{len(sections)} studies; page built {stamp} from commit <code>{html.escape(prov['commit'][:12])}</code>
(tokenfactory {html.escape(prov['tokenfactory'])}; versions at the bottom).</p>
</header>
<div class="layout"><nav>{''.join(nav)}</nav>
<main>{body}</main></div>
<footer>Built from commit <code>{html.escape(prov['commit'])}</code>, tokenfactory {html.escape(prov['tokenfactory'])},
Python {html.escape(prov['python'])}; {html.escape(versions)}.</footer>
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
