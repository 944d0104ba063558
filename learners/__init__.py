"""Reference learner loops that implement Keel's losses and stream to a Keel server.

- `learners.toy`: the toy off-policy grid (docs/losses.md), batched (`keel grid`, `keel sim`).
- `learners.lm`: a small transformer policy trained asynchronously, a stale bf16 sampler
  beside an fp32 learner, on a verifiable task (`keel lm`, `keel lm-grid`; docs/lm.md).

These are programs built on `trainer_hooks`, the way a user's trainer is; nothing in
`trainer_hooks`, `server` or `dashboard` imports them.
"""
