"""The models hpac's tests, demo and benchmarks train: transformers' Qwen3MoeForCausalLM built from the hpac-train
YAML's `model` section with random weights (nothing downloaded), and the token batches hpac-train draws."""
import torch

# The builder itself is library code (hpac plan builds the YAML's model on the meta device): hpac._models.
from .._models import qwen3_moe_config, qwen3_moe_model  # noqa: F401


def token_batch(vocab, batch, seq, seed, step):
    """Each row an arithmetic sequence modulo the vocabulary, start and stride drawn from a generator seeded by
    (seed, step): the formula of hpac-train's tokenBatch (tools/trainer/trainer.cpp), strides below 8."""
    g = torch.Generator().manual_seed(seed * 7919 + step + 1)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, max(2, min(vocab, 8)), (batch, 1), generator=g)
    return (start + stride * torch.arange(seq).unsqueeze(0)) % vocab
