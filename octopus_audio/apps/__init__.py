"""The applications over the core that need no model: `octopus-audio bench` (kernel timings on a GPU,
`bench.py`) and `octopus-audio probe` (the synthetic codec tables, `probe.py`)."""
