"""The target's shapes (Qwen3-30B-A3B's layers), the frontier there, and the accelerator check."""
