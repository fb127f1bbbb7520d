"""A Qwen3-MoE-style block for the Python tests: attention with causal softmax and dropout, a router with
float32 softmax -> topk -> in-place renormalisation, experts looped over the experts hit with index_add_.

Attention is either "eager" (q @ kᵀ, masked softmax, dropout, @ v: the S×S scores come out of aten::bmm) or "sdpa"
(F.scaled_dot_product_attention; on CPU with dropout 0 one aten::_scaled_dot_product_flash_attention_for_cpu whose
outputs are B·H·S·D plus the log-sum-exp, with dropout > 0 torch's math path, which is bmm again)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


ATTENTION_KINDS = ("eager", "sdpa")


class Attention(nn.Module):
    def __init__(self, hidden, heads, dropout, attention="eager"):
        super().__init__()
        if attention not in ATTENTION_KINDS:
            raise ValueError(f"attention '{attention}' is not one of {ATTENTION_KINDS}")
        self.heads, self.dropout, self.attention = heads, dropout, attention
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        hd = h // self.heads
        q, k, v = (p(x).view(b, s, self.heads, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                 dropout_p=self.dropout if self.training else 0.0)
        else:
            scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
            scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
            out = F.dropout(scores.softmax(-1), self.dropout, training=self.training) @ v
        return self.o_proj(out.transpose(1, 2).reshape(b, s, h))


class Expert(nn.Module):
    def __init__(self, hidden, inter):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, hidden, experts, inter, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Expert(hidden, inter) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)  # in place, as norm_topk_prob
        weights = weights.to(x.dtype)
        out = torch.zeros_like(flat)
        mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for e in range(len(self.experts)):
            slot, token = torch.where(mask[e])
            if token.numel() == 0:
                continue
            y = self.experts[e](flat[token]) * weights[token, slot, None]
            out.index_add_(0, token, y)
        return out.view_as(x)


class Block(nn.Module):
    def __init__(self, hidden=32, heads=4, experts=4, inter=48, top_k=2, dropout=0.1, attention="eager"):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden)
        self.self_attn = Attention(hidden, heads, dropout, attention)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.mlp = SparseMoe(hidden, experts, inter, top_k)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))
