"""Evaluation: clip sources, conditioning, metrics, the batch runner, reports and listening pages."""
