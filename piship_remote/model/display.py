"""How the library's values look in a notebook and as text: small tables, escaped.

    html_table(["exit code", "stdout"], [[0, "ok"]], caption="CommandResult")
    text_table(["outcome", "count"], [["ok", 3], ["failed", 1]])
    tail("a long output ...", 200)

Everything put into HTML is escaped here, so a command's output or an item cannot
inject markup into the notebook.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable, Sequence

__all__ = ["html_pre", "html_table", "tail", "text_table"]

_ELLIPSIS = "…"


def tail(text: str, limit: int) -> str:
    """``text``, or its last ``limit`` characters after a mark saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{_ELLIPSIS}({len(text) - limit} characters before) {text[-limit:]}"


def html_pre(text: str) -> str:
    """``text`` as preformatted HTML (escaped), an empty mark when there is none."""
    if not text:
        return "<i>(empty)</i>"
    return f"<pre style='margin:0;white-space:pre-wrap'>{html.escape(text)}</pre>"


def html_table(
    header: Sequence[str] | None,
    rows: Iterable[Sequence[object]],
    *,
    caption: str | None = None,
    raw_cells: bool = False,
) -> str:
    """An HTML table; every header, caption and cell is escaped unless ``raw_cells`` says the
    cells are HTML this module made (``html_pre``)."""
    cell: Callable[[object], str] = str if raw_cells else (lambda value: html.escape(str(value)))
    parts = ["<table>"]
    if caption is not None:
        parts.append(f"<caption style='text-align:left'>{html.escape(caption)}</caption>")
    if header is not None:
        heads = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in header)
        parts.append(f"<thead><tr>{heads}</tr></thead>")
    parts.append("<tbody>")
    for row in rows:
        cells = "".join(f"<td style='text-align:left'>{cell(value)}</td>" for value in row)
        parts.append(f"<tr>{cells}</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def text_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Columns aligned with spaces, the header first; a cell's line breaks become spaces."""
    lines = [list(header)] + [[" ".join(str(value).split()) for value in row] for row in rows]
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    return "\n".join(
        "  ".join(value.ljust(width) for value, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )
