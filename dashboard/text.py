"""What a trainer sends is text: the one place its strings are made safe for where they are shown.

A trainer (or anyone holding an ingest token) chooses metric keys, run names, groups, tags,
config values, sample tokens and, through its keys, words of alert messages. Shown anywhere,
each must read as the characters sent, never as markup (docs/security.md, "What a trainer
sends is text"):

- Dash components (`html.*` children and attributes, `dcc.Dropdown` labels) and dash-ag-grid's
  plain cells are text already: React and the grid write them as text nodes and attribute
  values. Nothing to do there; never hand a trainer's string to `dcc.Markdown`,
  `dangerously_allow_html` or a cell renderer that parses HTML.
- Plotly is not: its titles, axis titles, annotations, legend and trace names and hover text
  render a subset of HTML (`<a href>` a link, `<span style>` any look, `<br>` a line break)
  and fill `%{...}` from the figure (`%{meta.key}`; an unknown name becomes nothing). Every
  trainer string that reaches a figure's text goes through `plot_text`; the markup the
  dashboard adds itself (`<b>`, `<br>`, its own spans) is written around the escaped text.
  A trainer string never becomes part of a `hovertemplate`: it goes in as data (`text`,
  `customdata`, the trace's name) that the template names.
- The runs table's name cell is a markdown link: `markdown_text` escapes the name in it.
"""

from __future__ import annotations

import string

__all__ = ["plot_text", "markdown_text"]

_PLOT_ENTITIES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        # "%{" would be a template: Plotly reads the entity back as "%" only after filling them.
        "%": "&#37;",
    }
)
_MARKDOWN_SPECIAL = frozenset(string.punctuation)
"""CommonMark lets a backslash escape any ASCII punctuation: escaping all of it leaves no
emphasis, link, inline HTML, entity (`&lt;`) or autolink to be read."""


def plot_text(value: object) -> str:
    """`value` as Plotly text that shows exactly its characters: `&`, `<`, `>` and `%` as HTML
    entities (Plotly decodes numeric and named entities when it draws text). Quotes stay: with
    no `<` left there is no tag, so no attribute for a quote to end."""
    return str(value).translate(_PLOT_ENTITIES)


def markdown_text(value: object) -> str:
    """`value` shown literally inside markdown (the runs table's link cell): every ASCII
    punctuation character backslash-escaped."""
    return "".join("\\" + c if c in _MARKDOWN_SPECIAL else c for c in str(value))
