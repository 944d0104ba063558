"""Keel for third-party trainers: one module per framework, imported only by its users.

    from trainer_hooks.integrations.trl import KeelCallback, KeelGRPOTrainer   # needs trl

Importing this package imports nothing: each module pulls in its own framework.
"""
