"""The kernel implementations: each takes a decode kind as a compile-time parameter and declares which calls
it supports (`flash.py` split-K attention, `score_tables.py` one-row attention, `native.py` SDPA where no key
is compressed, `encode.py` key and unit encode, `gluon/` the sm_90 kernels); the selector
(octopus_audio/kernels/select.py) picks among them."""
