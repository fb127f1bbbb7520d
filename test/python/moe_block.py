"""A Qwen3-MoE-style block for the Python tests: attention with causal softmax and dropout, a router with
float32 softmax -> topk -> in-place renormalisation, experts looped over the experts hit with index_add_."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Attention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, hidden, bias=False)
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        hd = h // self.heads
        q, k, v = (p(x).view(b, s, self.heads, hd).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)
        scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        probs = F.dropout(scores.softmax(-1), self.dropout, training=self.training)
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, s, h))


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
    def __init__(self, hidden=32, heads=4, experts=4, inter=48, top_k=2, dropout=0.1):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(hidden)
        self.self_attn = Attention(hidden, heads, dropout)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.mlp = SparseMoe(hidden, experts, inter, top_k)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))
