"""The `keel` command: one dispatcher (`keel.cli`) over the commands each package exposes,
plus the commands that join several packages (`keel sync`, `keel eval-alerts`).

Nothing in `trainer_hooks`, `learners`, `server` or `dashboard` imports this package.
"""
