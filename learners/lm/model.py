"""A small causal transformer policy, nanoGPT-style, in plain torch (no weights from anywhere).

Pre-norm blocks (LayerNorm → causal self-attention → LayerNorm → MLP), learned
position embeddings, an untied linear head. `SIZES["tiny"]` is what a 2-core CPU
trains in a couple of minutes; "small" is the GPU size. The learner runs whole
sequences; the sampler decodes with a `KVCache` (prefill the prompt, then one
token at a time), as an inference engine does: a different code path with its
own rounding, on top of the lower precision.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["SIZES", "GPT", "GPTConfig", "KVCache"]


@dataclass(frozen=True)
class GPTConfig:
    vocab: int = 12
    """Token ids: the task's digits and separators (task.VOCAB)."""
    context: int = 16
    """Longest sequence (prompt + answer); sets the position table."""
    layers: int = 2
    d_model: int = 64
    heads: int = 4
    mlp_ratio: int = 4


SIZES = {
    "tiny": GPTConfig(layers=2, d_model=64, heads=4),
    "small": GPTConfig(layers=4, d_model=256, heads=8),
}


class KVCache:
    """Keys and values of the tokens seen so far, per layer. Fill it with one call on the
    prompt (empty cache), then feed one token per call."""

    def __init__(self, layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * layers
        self.values: list[Tensor | None] = [None] * layers
        self.length = 0

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append this call's keys and values [B, H, T, Dh]; all of them so far."""
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            k, v = torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x_B_T_D: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        batch, length, width = x_B_T_D.shape
        q, k, v = (
            part.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
            for part in self.qkv(x_B_T_D).split(width, dim=-1)
        )
        if cache is not None:
            k, v = cache.extend(layer, k, v)
        # A single new token attends to everything before it: no mask. (SDPA's causal mask is
        # top-left aligned, hence "prefill on an empty cache, then one token at a time".)
        y_B_H_T_Dh = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        return self.proj(y_B_H_T_Dh.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_attn = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_mlp = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.mlp_ratio * config.d_model),
            nn.GELU(),
            nn.Linear(config.mlp_ratio * config.d_model, config.d_model),
        )

    def forward(self, x_B_T_D: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        x_B_T_D = x_B_T_D + self.attn(self.ln_attn(x_B_T_D), cache, layer)
        return x_B_T_D + self.mlp(self.ln_mlp(x_B_T_D))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab, config.d_model)
        self.pos_emb = nn.Embedding(config.context, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab)
        self.apply(self._init)
        # GPT-2's scaled init of the residual projections keeps early activations O(1).
        for name, param in self.named_parameters():
            if name.endswith(("proj.weight", "mlp.2.weight")):
                nn.init.normal_(param, std=0.02 / math.sqrt(2 * config.layers))
        # A zero head starts the policy uniform: every answer equally likely, reward at chance.
        nn.init.zeros_(self.head.weight)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    def forward(self, tokens_B_T: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits [B, T, V] of the next token after each of `tokens_B_T`.

        With a `cache`, the tokens continue those it holds (and are added to it).
        """
        start = cache.length if cache is not None else 0
        positions_T = torch.arange(start, start + tokens_B_T.shape[1], device=tokens_B_T.device)
        x_B_T_D = self.tok_emb(tokens_B_T) + self.pos_emb(positions_T)
        for layer, block in enumerate(self.blocks):
            x_B_T_D = block(x_B_T_D, cache, layer)
        if cache is not None:
            cache.length += tokens_B_T.shape[1]
        return self.head(self.ln_f(x_B_T_D))
