"""An AAR-compatible model (tokenizer + transformer) and the patch that puts a compressed KV cache under it."""
