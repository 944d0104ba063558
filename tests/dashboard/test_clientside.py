"""The dashboard's JavaScript lives in dashboard/assets/, never in Python strings (issue 38):
each clientside callback is a `ClientsideFunction(namespace, function_name)` whose function
an asset file defines under `window.dash_clientside.<namespace>`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboard"
ASSETS = DASHBOARD / "assets"

JS_FUNCTION = re.compile(r"\bfunction\b\s*\w*\s*\([^()]*\)\s*\{|(?:\([^()]*\)|\b\w+)\s*=>\s*[{(]?")
"""A JavaScript function with its body (`function (x) {`, `(x) => x`): what a clientside
callback held in a string starts with. dash-ag-grid's one-expression cell rules
({"function": "keelNumber(params.value)"}) are expressions, not functions, and pass."""


def inline_javascript(source: str, filename: str = "<source>") -> list[str]:
    """Where a module holds JavaScript: 'line N: ...' for every string literal (f-strings'
    parts included) with a function in it, and every clientside_callback whose first
    argument is a string rather than a ClientsideFunction."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and JS_FUNCTION.search(node.value):
            found.append((node.lineno, "a function in a string"))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "clientside_callback"
            and node.args
            and isinstance(node.args[0], (ast.Constant, ast.JoinedStr, ast.BinOp))
        ):
            found.append((node.lineno, "clientside_callback given a string"))
    return [f"line {line}: {what}" for line, what in sorted(found)]


def clientside_functions(source: str) -> list[tuple[str, str]]:
    """The (namespace, function_name) of every ClientsideFunction a module names with literals."""
    pairs = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "ClientsideFunction":
            arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
            if len(arguments) == 2 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in arguments):
                pairs.append((arguments[0].value, arguments[1].value))  # type: ignore[attr-defined]
    return pairs


def defined_functions(script: str) -> set[tuple[str, str]]:
    """(namespace, function_name) for the functions a script puts under window.dash_clientside:
    the keys of the object literal (or the returned object of an immediately-invoked function)
    assigned to window.dash_clientside.<namespace>."""
    defined: set[tuple[str, str]] = set()
    assignments = list(re.finditer(r"window\.dash_clientside\.(\w+)\s*=", script))
    ends = [following.start() for following in assignments[1:]] + [len(script)] * bool(assignments)
    for match, end in zip(assignments, ends, strict=True):
        keys = re.findall(r"^\s*(\w+)\s*:", script[match.end() : end], flags=re.MULTILINE)
        defined.update((match.group(1), key) for key in keys)
    return defined


def _modules() -> list[Path]:
    return sorted(DASHBOARD.rglob("*.py"))


def test_the_scan_finds_javascript_in_strings() -> None:
    planted = '''
X_AXIS = """
function (relayout) {
    return relayout;
}
"""
ARROW = f"(rows) => rows.length + {1}"
app.clientside_callback("window.keel.draw", Output("a", "b"), Input("c", "d"))
app.clientside_callback("%s" % name, Output("a", "b"), Input("c", "d"))
GRID = {"valueFormatter": {"function": "keelNumber(params.value)"}}
app.clientside_callback(ClientsideFunction("keel_runs", "compare_link"), Output("a", "b"), Input("c", "d"))
'''
    assert inline_javascript(planted) == [
        "line 2: a function in a string",
        "line 7: a function in a string",
        "line 8: clientside_callback given a string",
        "line 9: clientside_callback given a string",
    ]


def test_no_dashboard_module_holds_javascript() -> None:
    found = {
        str(path.relative_to(DASHBOARD)): hits
        for path in _modules()
        if (hits := inline_javascript(path.read_text(encoding="utf-8"), str(path)))
    }
    assert found == {}


def test_every_clientside_function_is_defined_in_an_asset() -> None:
    """Dash loads dashboard/assets/*.js on every page (assets/live/ in its own order, and it
    holds no clientside callbacks): each function a callback names is defined there."""
    defined = set().union(*(defined_functions(path.read_text(encoding="utf-8")) for path in ASSETS.glob("*.js")))
    named = {pair for path in _modules() for pair in clientside_functions(path.read_text(encoding="utf-8"))}
    assert {("keel_charts", "x_axis_only"), ("keel_details", "dist_readout"), ("keel_runs", "compare_link")} <= named
    assert sorted(named - defined) == []
