"""octopus-audio: OCTOPUS and peer rotation codecs for the KV cache of next-scale autoregressive audio models."""

__version__ = "0.1.0"
