"""Webhook delivery: formats, Standard Webhooks signatures, SSRF guard, durable outbox worker."""
