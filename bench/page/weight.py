"""weight: bytes over the wire for the compare page, cold and warm.

Cold (a fresh profile) and warm (the same profile, after about:blank), each until shown +
2 s: the sum of the Resource Timing transferSize of the navigation and every resource (0
for a cache hit; the websocket's frames are not counted). Targets <= 3 MiB cold, <= 512 KiB
warm; the 5 biggest listed.
"""

from __future__ import annotations

import argparse
import time
import urllib.parse
from typing import Any

from selenium import webdriver

from bench.page.browser import browser, open_page, probe
from bench.page.results import Results
from bench.page.streams import BenchRun
from dashboard.theme import HEADLINE_KEYS

__all__ = ["part_weight"]

MiB = 1024 * 1024
RESOURCES_JS = (
    "return performance.getEntriesByType('navigation').concat(performance.getEntriesByType('resource'))"
    ".map(function (e) { return {name: e.name, transfer: e.transferSize, encoded: e.encodedBodySize,"
    " decoded: e.decodedBodySize}; })"
)


def resources(driver: webdriver.Chrome) -> list[dict[str, Any]]:
    return list(driver.execute_script(RESOURCES_JS))


def part_weight(args: argparse.Namespace, base: str, runs: list[BenchRun], results: Results) -> None:
    ids = [run.id for run in runs]
    url = f"{base}/compare?runs={','.join(ids)}"
    source = probe("keel", HEADLINE_KEYS, ids)
    loads: dict[str, tuple[float, list[dict[str, Any]]]] = {}
    with browser(args.window) as driver:
        for temperature in ("cold", "warm"):
            shown = open_page(driver, url, source, f"compare ({temperature}) shown")
            time.sleep(2)
            loads[temperature] = (shown, resources(driver))
            driver.get("about:blank")
            time.sleep(0.5)
    for temperature, (shown, entries) in loads.items():
        total = sum(e["transfer"] for e in entries)
        biggest = sorted(entries, key=lambda e: -e["transfer"])[:5]
        results.details[f"weight/{temperature}"] = {"shown_s": shown, "bytes": total, "requests": len(entries), "biggest": biggest}
        note = "; biggest: " + ", ".join(f"{_short(e['name'])} {e['transfer'] / 1024:,.0f} KiB" for e in biggest)
        if temperature == "cold":
            results.add("weight", "compare page, cold, transferred", total / MiB, "MiB", "<= 3", lambda v: v <= 3,
                        f"({len(entries)} requests){note}")  # fmt: skip
        else:
            results.add("weight", "compare page, warm, transferred", total / 1024, "KiB", "<= 512", lambda v: v <= 512,
                        f"({len(entries)} requests){note}")  # fmt: skip
        results.add("weight", f"compare page, {temperature}, load time (same browser)", shown, "s")


def _short(url: str) -> str:
    path = urllib.parse.urlsplit(url).path
    return path.rsplit("/", 1)[-1][:40] or path
