"""report.html: one self-contained page (pictures embedded as data URIs, no script, nothing loaded from elsewhere)
that any browser opens from disk or as an attachment."""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Set

from tfdata_readers.inspection.class_chart import balance, balance_text
from tfdata_readers.inspection.gather import Inspection
from tfdata_readers.inspection.units import format_mib

__all__ = ["balance_footer", "render_report"]

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 24px auto; max-width: 1280px;
       padding: 0 16px; color: #1d1d1f; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 8px 0; } th, td { padding: 3px 10px; border-bottom: 1px solid #eee;
       text-align: left; vertical-align: top; } td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
.bad { color: #b71c1c; font-weight: 600; } .ok { color: #1b5e20; } .muted { color: #777; }
.problems { background: #fdecea; border: 1px solid #f5c6cb; padding: 8px 14px; border-radius: 6px; }
img { max-width: 100%; height: auto; border: 1px solid #ddd; } code { font-size: 12px; }
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _data_uri(data: bytes) -> str:
    kind = "png" if data.startswith(b"\x89PNG") else "jpeg"
    return f"data:image/{kind};base64," + base64.b64encode(data).decode("ascii")


def _table(table_id: str, header: list[str], rows: list[list[str]], numeric: Set[int] = frozenset()) -> str:
    """Cells are HTML already; `numeric` columns are right-aligned."""
    head = "".join(f'<th class="n">{_e(h)}</th>' if i in numeric else f"<th>{_e(h)}</th>" for i, h in enumerate(header))
    body = "".join(
        "<tr>"
        + "".join(f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f'<table id="{_e(table_id)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _card(report: Inspection) -> str:
    info, raw = report.info, report.info.raw
    producer = raw.get("producer", {})
    rows = [
        ["data dir", f"<code>{_e(report.data_dir)}</code>"],
        ["producer", _e(f"{producer.get('name', '?')} {producer.get('version', '?')}")],
        ["splits", _e(", ".join(f"{s} ({info.splits[s].num_examples})" for s in report.splits))],
        ["examples", _e(sum(s.num_examples for s in info.splits.values()))],
        ["classes", _e(info.num_classes)],
        ["image", _e(f"{info.image.size_text}, {info.image.channels} channel(s), {info.image.format}")],
        ["preprocessing", f"<code>{_e(json.dumps(raw.get('preprocessing', {}), sort_keys=True))}</code>"],
        ["dead letters", _e(raw.get("num_dead_letters", "?"))],
        ["fingerprint", f"<code>{_e(raw.get('fingerprint', '?'))}</code>"],
    ]
    return _table("card", ["", ""], rows)


def _shards(report: Inspection) -> str:
    rows = []
    for row in report.shards:
        verdict = (
            '<span class="ok">verified</span>'
            if row.verified
            else '<span class="bad">' + "<br>".join(_e(p) for p in row.problems) + "</span>"
        )
        rows.append(
            [_e(row.split), f"<code>{_e(row.file)}</code>", _e(row.num_examples), _e(format_mib(row.bytes)), verdict]
        )
    return _table("shards", ["split", "file", "examples", "MiB", "bytes, sha256 and records"], rows, {2, 3})


def balance_footer(split: str, counts: dict[str, int]) -> str:
    """The line under the class table for one split: its balance, and its empty classes."""
    summary = balance(counts)
    empty = f", empty: {', '.join(summary.empty)}" if summary.empty else ""
    return f"{split}: {balance_text(summary)}{empty}"


def _classes(report: Inspection) -> str:
    splits = report.splits
    names = list(report.info.label_names)
    rows = [
        [_e(i), _e(name)]
        + [(_e(n) if (n := report.class_counts[s].get(name, 0)) else '<span class="bad">0</span>') for s in splits]
        for i, name in enumerate(names)
    ]
    footer = [balance_footer(s, report.class_counts[s]) for s in splits]
    source = (
        ""
        if report.class_counts_source == "dataset_info.json"
        else f'<p class="muted">{_e(report.class_counts_source)}</p>'
    )
    notes = "".join(f"<p>{_e(line)}</p>" for line in footer)
    return _table("classes", ["id", "class", *splits], rows, set(range(2, 2 + len(splits)))) + notes + source


def _dead_letters(report: Inspection) -> str:
    rows = [
        [f"<code>{_e(g.reason)}</code>", _e(g.count), "<br>".join(f"<code>{_e(u)}</code>" for u in g.first_uris)]
        for g in report.dead_letters
    ]
    note = f'<p class="bad">{_e(report.dead_letters_note)}</p>' if report.dead_letters_note else ""
    if not rows:
        return note + '<p id="dead-letters-none">No dead letters: every listed input became an example.</p>'
    return _table("dead-letters", ["reason", "count", "first uris"], rows, {1}) + note


def _problems(report: Inspection) -> str:
    lines = [f"{row.split}/{row.file}: {p}" for row in report.shards for p in row.problems]
    lines += list(report.other_problems)
    lines += [f"sample of {s.split}: {s.error}" for s in report.samples.values() if s.error]
    if not lines:
        return '<p class="ok" id="status">Every shard verified against dataset_info.json.</p>'
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return f'<div class="problems" id="status"><b>{len(lines)} problem(s) found</b><ul>{items}</ul></div>'


def render_report(
    report: Inspection, *, sheets: dict[str, bytes], chart: bytes, group_sheets: dict[str, bytes] | None = None
) -> str:
    """The page. `sheets` maps split -> contact sheet (PNG or JPEG bytes), `chart` is the class
    histogram PNG, `group_sheets` maps a split group's id -> the sheet of its members."""
    groups = "".join(
        f'<img id="group-sheet-{index}" alt="members of split group {_e(group)}" src="{_data_uri(picture)}">'
        for index, (group, picture) in enumerate((group_sheets or {}).items(), start=1)
    )
    if groups:
        groups = (
            '<h2>Largest split groups</h2><p class="muted">Inputs kept in one split as near-copies or by your '
            f"groups (dataset_info.json's split_groups); each caption names its split.</p>{groups}"
        )
    pictures = "".join(
        f'<h3>{_e(split)}</h3><p class="muted">{len(report.samples[split].examples)} examples drawn with seed '
        f"{report.seed} from the first {report.samples[split].scanned} records</p>"
        f'<img id="contact-sheet-{_e(split)}" alt="contact sheet of {_e(split)}" src="{_data_uri(png)}">'
        for split, png in sheets.items()
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Dataset report: {_e(report.data_dir)}</title><style>{_STYLE}</style></head>
<body>
<h1>Dataset report</h1><p class="muted"><code>{_e(report.data_dir)}</code></p>
{_problems(report)}
<h2>Dataset card</h2>{_card(report)}
<h2>Shards</h2>{_shards(report)}
<h2>Classes</h2>{_classes(report)}
<img id="class-counts" alt="examples per class and split" src="{_data_uri(chart)}">
<h2>Dead letters</h2>{_dead_letters(report)}
<h2>Examples</h2>{pictures}
{groups}
</body></html>
"""
