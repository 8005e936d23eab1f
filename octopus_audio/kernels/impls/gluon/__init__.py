"""The sm_90 (Hopper) Gluon kernels: the warp-specialised attention (`flash.py`, its per-kind decode sections
`decode.py`) and the polarquant key encode (`encode.py`). `scope.py` says which calls they take and imports
no Gluon; the others are imported only where the device and the installed Triton allow (the selector,
octopus_audio/kernels/select.py, decides), so importing this package imports nothing of them."""
