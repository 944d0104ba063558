"""Reference learner loops that implement Keel's losses and stream to a Keel server.

- `learners.toy`: the seed's toy off-policy grid, batched (`keel grid`, `keel sim`).

These are programs built on `trainer_hooks`, the way a user's trainer is; nothing in
`trainer_hooks`, `server` or `dashboard` imports them.
"""
