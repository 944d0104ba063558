"""Render a webhook event for each receiver format: generic, slack, discord, alertmanager."""

from __future__ import annotations

from typing import Any

import orjson

FORMATS = ("generic", "slack", "discord", "alertmanager")

SLACK_TEXT_LIMIT = 3000  # a section block's text
DISCORD_CONTENT_LIMIT = 2000
DISCORD_TITLE_LIMIT = 256
DISCORD_DESCRIPTION_LIMIT = 4096
DISCORD_FIELD_LIMIT = 1024
_COLORS = {"critical": 0xD62728, "warning": 0xFF7F0E, "info": 0x1F77B4, "resolved": 0x2CA02C}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _headline(event: dict[str, Any]) -> str:
    alert = event["alert"]
    state = "TEST" if event["type"] == "test" else alert["state"].upper()
    return f"[{state}] {alert['severity']}: {alert['rule']} on {alert['run_name']}"


def _details(alert: dict[str, Any]) -> list[tuple[str, str]]:
    return [
        ("Run", f"{alert['run_name']} ({alert['run_id']})"),
        ("Project / group", f"{alert['project']} / {alert.get('group') or '-'}"),
        ("Rule", str(alert["rule"])),
        ("Metric", str(alert["metric"])),
        ("Severity", str(alert["severity"])),
        ("State", str(alert["state"])),
        ("Step", str(alert["step"])),
        ("Value", str(alert["value"])),
    ]


def generic(event: dict[str, Any]) -> dict[str, Any]:
    return event


def slack(event: dict[str, Any]) -> dict[str, Any]:
    alert = event["alert"]
    fields = "\n".join(f"*{name}:* {value}" for name, value in _details(alert))
    return {
        "text": _cut(_headline(event), SLACK_TEXT_LIMIT),
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(f"*{_headline(event)}*\n{alert['message']}", SLACK_TEXT_LIMIT)}},
            {"type": "section", "text": {"type": "mrkdwn", "text": _cut(fields, SLACK_TEXT_LIMIT)}},
            {"type": "actions", "elements": [
                {"type": "button", "text": {"type": "plain_text", "text": "Open in Keel"}, "url": alert["url"]},
                *([{"type": "button", "text": {"type": "plain_text", "text": "Checkpoint or stop"}, "url": alert["run_url"]}] if alert.get("run_url") else []),
            ]},
        ],
    }


def discord(event: dict[str, Any]) -> dict[str, Any]:
    alert = event["alert"]
    color = _COLORS["resolved"] if alert["state"] == "resolved" else _COLORS.get(alert["severity"], _COLORS["info"])
    return {
        "content": _cut(_headline(event), DISCORD_CONTENT_LIMIT),
        "embeds": [
            {
                "title": _cut(f"{alert['rule']}: {alert['run_name']}", DISCORD_TITLE_LIMIT),
                "description": _cut(str(alert["message"]), DISCORD_DESCRIPTION_LIMIT),
                "url": alert["url"],
                "color": color,
                "fields": [{"name": name, "value": _cut(value, DISCORD_FIELD_LIMIT), "inline": True} for name, value in _details(alert)],
            }
        ],
        "allowed_mentions": {"parse": []},
    }


def alertmanager(event: dict[str, Any]) -> dict[str, Any]:
    """Alertmanager webhook payload, version 4."""
    alert = event["alert"]
    status = "resolved" if alert["state"] == "resolved" else "firing"
    labels = {
        "alertname": alert["rule"],
        "severity": alert["severity"],
        "run_id": alert["run_id"],
        "run_name": alert["run_name"],
        "project": alert["project"],
        "group": alert.get("group") or "",
        "metric": alert["metric"],
    }
    annotations = {"summary": _headline(event), "description": str(alert["message"]), "step": str(alert["step"]), "value": str(alert["value"])}
    return {
        "version": "4",
        "groupKey": f"{{}}:{{alertname=\"{alert['rule']}\", run_id=\"{alert['run_id']}\"}}",
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "keel",
        "groupLabels": {"alertname": alert["rule"], "run_id": alert["run_id"]},
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": alert["url"].split("/compare", 1)[0],
        "alerts": [
            {
                "status": status,
                "labels": labels,
                "annotations": annotations,
                "startsAt": alert["started_at"],
                "endsAt": alert["resolved_at"] or "0001-01-01T00:00:00Z",
                "generatorURL": alert["url"],
                "fingerprint": alert["fingerprint"],
            }
        ],
    }


_RENDERERS = {"generic": generic, "slack": slack, "discord": discord, "alertmanager": alertmanager}


def render(format_name: str, event: dict[str, Any]) -> bytes:
    return orjson.dumps(_RENDERERS[format_name](event))
