"""Signal metrics of a generated signal against a reference, one per module (LSD, SNR, log-mel MSE, latent
cosine) and their shared input checks and STFT (`audio_pair`); used by `eval`, `generate --compare` and the
tokenizer's held-out figures."""
