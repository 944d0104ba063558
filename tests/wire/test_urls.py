"""wire/urls.py: the one reading of a server URL, and every client that takes one accepting
and refusing the same forms (the Monitor, its ingest socket, the dashboard link it prints,
`keel.client.Client`, `keel watch`'s config PATCH)."""

from __future__ import annotations

from pathlib import Path

import pytest

from keel.client import Client
from keel.config_push import api_url as config_api_url
from trainer_hooks.monitor import Monitor, dashboard_url
from trainer_hooks.sender import ingest_url as sender_ingest_url
from wire.urls import api_url, ingest_url, run_page_url, server_base

ACCEPTED = [
    # (given, server_base)
    ("http://127.0.0.1:8750", "http://127.0.0.1:8750"),
    ("  http://127.0.0.1:8750/  ", "http://127.0.0.1:8750"),
    ("HTTP://Keel.Example.org:80", "http://Keel.Example.org:80"),
    ("https://keel.example.org", "https://keel.example.org"),
    ("https://keel.example.org/keel/", "https://keel.example.org/keel"),
    ("ws://127.0.0.1:8750", "http://127.0.0.1:8750"),
    ("ws://127.0.0.1:8750/api/v1/ingest", "http://127.0.0.1:8750"),
    ("wss://keel.example.org/keel/api/v1/ingest/", "https://keel.example.org/keel"),
    ("wss://keel.example.org/keel/api/v1", "https://keel.example.org/keel"),
    ("http://h:1/api/v1", "http://h:1"),
    ("http://[::1]:8750", "http://[::1]:8750"),
]

REFUSED = [
    "127.0.0.1:8750",  # no scheme
    "localhost:8750",  # parsed as scheme "localhost"
    "keel.example.org",
    "ftp://keel.example.org",
    "file:///tmp/keel.db",
    "grpc://h:1",
    "http://",
    "http://:8750",
    "http:keel",
    "http://h:port",
    "http://h:70000",
    "http://h:0",
    "http://h:1/?token=x",
    "http://h:1/#runs",
    "",
    "   ",
]


@pytest.mark.parametrize(("given", "base"), ACCEPTED)
def test_an_accepted_server_url_and_what_each_client_makes_of_it(given: str, base: str) -> None:
    assert server_base(given) == base
    assert api_url(given) == f"{base}/api/v1"
    socket_scheme = "wss" if base.startswith("https:") else "ws"
    assert ingest_url(given) == f"{socket_scheme}:{base.split(':', 1)[1]}/api/v1/ingest"
    assert run_page_url(given, "R 1/2") == f"{base}/runs/R%201%2F2"
    # every client derives its URL from the same base
    assert Client(given).base == f"{base}/api/v1"
    assert config_api_url(given) == f"{base}/api/v1"
    assert sender_ingest_url(given) == ingest_url(given)
    assert dashboard_url(given, "R") == f"{base}/runs/R"


@pytest.mark.parametrize("given", REFUSED)
def test_a_refused_server_url_is_refused_by_every_client_saying_what_was_expected(given: str, tmp_path: Path) -> None:
    expected = r"server URL must look like http://host:port\[/prefix\] \(or https://, ws://, wss://"
    for make in (
        server_base,
        api_url,
        ingest_url,
        lambda url: run_page_url(url, "R"),
        Client,
        config_api_url,
        sender_ingest_url,
        lambda url: dashboard_url(url, "R"),
        lambda url: Monitor(url, run_name="refused", spool_dir=tmp_path),
    ):
        with pytest.raises(ValueError, match=expected) as refused:
            make(given)
        assert repr(given) in str(refused.value)


def test_a_url_without_a_scheme_gets_a_suggestion() -> None:
    with pytest.raises(ValueError, match=r"did you mean http://127\.0\.0\.1:8750\?"):
        server_base("127.0.0.1:8750")
    with pytest.raises(ValueError, match=r"\(scheme 'ftp'\)"):
        server_base("ftp://h:1")
    with pytest.raises(ValueError, match=r"\(no host\)"):
        server_base("http://:8750")
    with pytest.raises(ValueError, match=r"no \?query or #fragment"):
        server_base("http://h:1?token=x")
