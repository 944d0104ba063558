"""Webhooks: their registry and outbox rows, formats, Standard Webhooks signatures, SSRF guard, durable outbox worker."""
