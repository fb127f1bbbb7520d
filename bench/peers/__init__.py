"""hpac beside what else a user could run: torch.utils.checkpoint, a Python-mode SAC, PyTorch's own SAC, torchtitan's
SAC, torch.compile's memory budget."""
