"""On the CPU (OCTOPUS_AUDIO_TEST_DEVICE unset or cpu) the Triton kernels run under the interpreter, which
must be on before Triton decorates anything: set here, before any test module is collected, so a run does
not depend on which modules it collects first (the kernel test modules set it at import too, for a module
run on its own)."""

import os

if os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def fewer_bootstrap_resamples(monkeypatch):
    """The eval report's bootstrap with 64 resamples instead of 1000: every resample refits each row's
    Gaussians (a second or more of CPU a report), and the tests check the statistics, not the interval's
    precision (tests/test_eval_distribution.py sets its own counts where it checks them)."""
    from octopus_audio.eval import distribution

    monkeypatch.setattr(distribution, "RESAMPLES", 64)
