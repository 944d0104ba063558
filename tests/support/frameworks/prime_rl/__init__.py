"""prime-rl 0.8.0 (commit 559b44772e471d1538537b8805cc77f3824a5e64): the `prime_rl.monitors`
package only (tests/support/frameworks/README.md). prime-rl is not on PyPI and needs vLLM,
flash-attn and CUDA torch."""
