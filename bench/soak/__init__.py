"""Long runs: memory flat over many steps, dropped forwards, exceptions and rebuilt models."""
