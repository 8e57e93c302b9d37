"""report.html: a study's report.md as one page to share, drawn from the same text and figures. No torch.

    html = page(report_text, {"2_key_pr_causal.png": png_bytes, ...})

One self-contained file: the figures embedded as data: URIs, the style inline, no script, no request to any other file
or host (a figure the report names but that was not drawn is said in words, never linked). The Markdown is parsed by
markdown-it-py (CommonMark with tables; raw HTML in the text is escaped). The report's own order is kept; a figure
placed right after a table is laid out beside it; every outcome word is marked the same way (the legend under "In
short" names the marks); headings carry GitHub's ids, so a link to a section of report.md works on report.html too.
research.plots.common.write_outputs writes it beside every report.md.
"""
from __future__ import annotations

import base64
import html
import re

from markdown_it import MarkdownIt
from markdown_it.token import Token

from research.analysis import claims, conditions, rules, spikes
from research.analysis.wording import OPEN

# outcome word -> (mark class, what it means): one mark per kind of answer, the same on every page
OUTCOMES = {
    rules.DIFFERENT: ("beyond", "different, wholly beyond the margin"),
    rules.WITHIN: ("within", "different, but wholly inside the margin"),
    rules.EQUAL: ("equal", "equal: inside the margin, 0 included"),
    rules.UNRESOLVED: ("unresolved", "real, its size against the margin not settled"),
    rules.INCONCLUSIVE: ("open", "not decided: the interval holds 0 and reaches past the margin"),
    rules.NO_SPREAD: ("untested", "not tested: every seed differs by the same amount"),
    rules.DESCRIPTIVE: ("untested", "not tested: one seed, described only"),
    rules.NO_DATA: ("untested", "not tested: no paired values"),
    claims.HOLDS: ("beyond", "the claim holds"),
    claims.FAILS: ("fails", "the claim fails"),
    claims.MIXED: ("unresolved", "the claim holds for some conditions, fails for others"),
    claims.UNTESTED: ("untested", "not tested: no interval here, or nothing to test"),
    conditions.BEYOND: ("beyond", "differs, wholly beyond the margin"),
    conditions.INSIDE: ("within", "lies wholly inside the margin"),
    conditions.REAL: ("unresolved", "differs, its size against the margin not settled"),
    conditions.OPEN: ("open", "not decided: the interval holds 0 and reaches past the margin"),
    spikes.WARNS: ("beyond", "the signal warns before spikes, above both nulls"),
    spikes.NO_WARNING: ("equal", "the signal is shown not to warn"),
    spikes.NO_THRESHOLD: ("untested", "no usable threshold: not tested"),
}
_WORDS = sorted(OUTCOMES, key=len, reverse=True)  # the longest first: "different, size unresolved" before "different"
_MARKS = "\u2020" + OPEN + "*"  # footnote marks that may follow an outcome word

STYLE = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:#1b1b1b;
margin:0 auto;padding:12px 24px 48px;max-width:1560px}
h1{font-size:22px;margin:6px 0 8px}h2{font-size:18px;margin:22px 0 6px;border-bottom:1px solid #ddd}
h3{font-size:16px;margin:16px 0 4px}p,li{max-width:1250px}ul{padding-left:22px;margin:4px 0}
section.short{background:#f6f8fa;border:1px solid #d8dee4;border-radius:6px;padding:2px 14px 8px}
section.short h2{border:0;margin-top:8px}section.short li{margin:2px 0}
table{border-collapse:collapse;font-size:13px;margin:6px 0}th,td{border:1px solid #d0d7de;padding:3px 6px;
vertical-align:top}th{background:#f6f8fa;text-align:left}
.beside{display:flex;flex-wrap:wrap;gap:18px;align-items:flex-start}.beside>.col{flex:1 1 560px;min-width:0}
.col table{max-width:100%}
figure{margin:8px 0;flex:1 1 520px;max-width:900px}figure img{width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:13px;color:#555}.missing{color:#8a1c1c}
.o{border-radius:3px;padding:0 3px;white-space:nowrap}
.o-beyond{background:#cfe2f3;color:#0b3d66}.o-within{background:#d9ead3;color:#1e4620}
.o-equal{background:#e2f0d9;color:#1e4620}.o-unresolved{background:#fde9c9;color:#6b4200}
.o-open{background:#ececec;color:#333}.o-untested{background:#fff;color:#555;border:1px dashed #999}
.o-fails{background:#f4cccc;color:#6b1010}
ul.legend{font-size:13px;margin:8px 0 0;padding:0}ul.legend span.o{margin-right:4px}
section.short ul.legend li{display:inline-block;margin:0 16px 2px 0}
pre,code{font-size:13px;background:#f6f8fa}pre{padding:6px;overflow-x:auto}
"""


def outcome_of(text: str) -> str | None:
    """The outcome word `text` opens with (after a leading 'not decided (' as common.undecided_text words it), or
    None."""
    text = text.strip().removeprefix("not decided (")
    for word in _WORDS:
        if text.startswith(word) and text[len(word):len(word) + 1] in ("", " ", ",", ";", ")", ":", *_MARKS):
            return word
    return None


def slug(text: str, seen: dict[str, int]) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped, spaces as '-', '-1', '-2' for repeats."""
    base = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    n = seen.get(base, 0)
    seen[base] = n + 1
    return base if n == 0 else f"{base}-{n}"


def _html_token(content: str) -> Token:
    token = Token("html_block", "", 0)
    token.content = content
    return token


def _image_only(inline: Token) -> bool:
    kids = [k for k in inline.children or [] if not (k.type in ("softbreak", "hardbreak") or
                                                     (k.type == "text" and not k.content.strip()))]
    return bool(kids) and all(k.type == "image" for k in kids)


def _mark(tokens: list[Token], used: set[str]) -> None:
    """Outcome words marked: a table cell that opens with one, and bold text that is one."""
    for i, tok in enumerate(tokens):
        if tok.type == "td_open" and i + 1 < len(tokens) and tokens[i + 1].type == "inline":
            word = outcome_of(tokens[i + 1].content)
            if word:
                tok.attrSet("class", f"o o-{OUTCOMES[word][0]}")
                used.add(word)
        if tok.type == "inline":
            kids = tok.children or []
            for j, kid in enumerate(kids[:-2]):
                if kid.type == "strong_open" and kids[j + 1].type == "text" and kids[j + 2].type == "strong_close":
                    word = outcome_of(kids[j + 1].content)
                    if word and kids[j + 1].content.strip().rstrip(_MARKS) == word:
                        kid.attrSet("class", f"o o-{OUTCOMES[word][0]}")
                        used.add(word)


def _layout(tokens: list[Token]) -> list[Token]:
    """Headings given ids; a paragraph of figures drawn as figures; a table followed by figures wrapped beside them;
    the "In short" section boxed, the legend after it."""
    seen: dict[str, int] = {}
    out: list[Token] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok.type == "heading_open":
            tok.attrSet("id", slug(tokens[i + 1].content, seen))
        if tok.type == "table_open":  # the table, the notes under it (two paragraphs at most), then its figure
            after = next(j for j in range(i, len(tokens)) if tokens[j].type == "table_close") + 1
            notes = 0
            while notes < 2 and after + 2 < len(tokens) and tokens[after].type == "paragraph_open" and \
                    not _image_only(tokens[after + 1]):
                after, notes = after + 3, notes + 1
            if after + 2 < len(tokens) and tokens[after].type == "paragraph_open" and _image_only(tokens[after + 1]):
                out += [_html_token('<div class="beside">\n<div class="col">\n'), *tokens[i:after],
                        _html_token("</div>\n"), *tokens[after:after + 3], _html_token("</div>\n")]
                i = after + 3
                continue
        out.append(tok)
        i += 1
    for j, tok in enumerate(out):  # paragraphs of images only: figures, no <p>
        if tok.type == "paragraph_open" and j + 1 < len(out) and out[j + 1].type == "inline" and \
                _image_only(out[j + 1]):
            tok.hidden = out[j + 2].hidden = True
    return out


def _short_box(tokens: list[Token], legend: str) -> list[Token]:
    """The "In short" section (from its heading to the next one) in a box, the legend at its end."""
    start = next((i for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"
                  and tokens[i + 1].content.strip() == "In short"), None)
    if start is None:
        return tokens
    end = next((i for i in range(start + 3, len(tokens)) if tokens[i].type == "heading_open"
                and tokens[i].tag in ("h1", "h2")), len(tokens))
    return [*tokens[:start], _html_token('<section class="short">\n'), *tokens[start:end],
            _html_token(legend + "</section>\n"), *tokens[end:]]


def legend(used: set[str]) -> str:
    """The marks this page uses, each with its meaning, in OUTCOMES' order."""
    if not used:
        return ""
    items = "".join(f'<li><span class="o o-{OUTCOMES[w][0]}">{html.escape(w)}</span> {html.escape(OUTCOMES[w][1])}'
                    f"</li>" for w in OUTCOMES if w in used)
    return f'<ul class="legend" aria-label="outcome marks">{items}</ul>\n'


def page(report: str, images: dict[str, bytes]) -> str:
    """report.html of `report` (report.md's text) with `images` (file name -> PNG bytes) embedded where the report
    places them."""
    md = MarkdownIt("commonmark", {"html": False, "typographer": False}).enable("table")

    def image(renderer, tokens, idx, options, env):
        tok = tokens[idx]
        name, alt = tok.attrGet("src") or "", html.escape(tok.content or "")
        data = images.get(name)
        if data is None:
            return f'<p class="missing">({html.escape(name)}: not drawn)</p>'
        uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        return f'<figure><img src="{uri}" alt="{alt}"><figcaption>{html.escape(name)}: {alt}</figcaption></figure>'
    md.add_render_rule("image", image)
    tokens = md.parse(report)
    used: set[str] = set()
    _mark(tokens, used)
    tokens = _short_box(_layout(tokens), legend(used))
    title = next((tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h1"),
                 "report")
    body = md.renderer.render(tokens, md.options, {})
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n{body}</body>\n</html>\n")
