"""gzip on the wire (server/compression.py): what a browser loads, against a real server."""

from __future__ import annotations

import gzip
import re

import httpx


def _raw(url: str, encoding: str) -> tuple[httpx.Headers, bytes]:
    with httpx.Client(timeout=30) as client, client.stream("GET", url, headers={"Accept-Encoding": encoding}) as response:
        assert response.status_code == 200, url
        return response.headers, b"".join(response.iter_raw())


def test_the_page_its_scripts_and_the_api_travel_compressed_and_unchanged(server_factory, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    server = server_factory(sqlite_url)
    page_headers, page = _raw(f"{server.url}/", "gzip")
    assert page_headers["content-encoding"] == "gzip"
    html = gzip.decompress(page).decode()
    grid = next(src for src in re.findall(r'src="([^"]+)"', html) if "dash_ag_grid" in src)  # fingerprinted
    url = f"{server.url}/_dash-component-suites/plotly/package_data/plotly.min.js"  # loaded by the charts

    plain_headers, plain = _raw(url, "identity")
    assert "content-encoding" not in plain_headers and len(plain) > 1_000_000  # plotly.js
    first_headers, first = _raw(url, "gzip")
    again_headers, again = _raw(url, "gzip, deflate, br")
    assert first_headers["content-encoding"] == "gzip" and first_headers["vary"] == "Accept-Encoding"
    assert gzip.decompress(first) == plain and again == first  # the second from memory, the same bytes
    assert len(first) < len(plain) / 3
    assert int(first_headers["content-length"]) == len(first)
    # A warm load revalidates it: nothing but the headers travels.
    with httpx.Client(timeout=30) as client:
        revalidated = client.get(url, headers={"Accept-Encoding": "gzip", "If-None-Match": first_headers["etag"]})
    assert revalidated.status_code == 304 and revalidated.content == b""
    grid_headers, grid_body = _raw(f"{server.url}{grid}", "gzip")
    assert grid_headers["content-encoding"] == "gzip" and "max-age" in grid_headers["cache-control"]
    assert gzip.decompress(grid_body) == _raw(f"{server.url}{grid}", "identity")[1]

    # The API: JSON compressed when a client accepts it, as is otherwise.
    api_headers, api = _raw(f"{server.url}/openapi.json", "gzip")
    assert api_headers["content-encoding"] == "gzip"
    assert gzip.decompress(api) == _raw(f"{server.url}/openapi.json", "identity")[1]
