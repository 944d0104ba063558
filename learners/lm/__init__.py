"""A small transformer policy trained asynchronously, streaming to Keel (`keel lm`, docs/lm.md).

- `model`: the nanoGPT-style causal transformer (with a KV cache for the sampler).
- `task`: sort digits (fixed-length answers), or copy them (`copy`: answers that end with
  <eos> under a length cap, a 64-token vocabulary); partial-credit rewards.
- `advantages`: group (GRPO), group_std (divided by the group's std) and batch advantages.
- `sampler`: the sampler thread on stale low-precision weights, recording log μ,
  sequence ids and policy versions; `WeightBoard`, where the learner publishes.
- `learner`: `LMConfig`, `learner_step` and `train`, the loop with the Keel lines.
- `grid`: `keel lm-grid`, its table, lead times and labelled corpus.

Nothing is imported here, so `import learners.lm.task` stays light.
"""
