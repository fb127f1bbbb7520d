"""The torch releases hpac was built and tested against (tools/torch_release_check.sh writes the JSON)."""
