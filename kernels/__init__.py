"""Triton kernels shared by every codec: encode, and fused attention over the compressed K/V cache."""
