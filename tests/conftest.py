"""On the CPU (OCTOPUS_AUDIO_TEST_DEVICE unset or cpu) the Triton kernels run under the interpreter, which
must be on before Triton decorates anything: set here, before any test module is collected, so a run does
not depend on which modules it collects first (the kernel test modules set it at import too, for a module
run on its own)."""

import os

if os.environ.get("OCTOPUS_AUDIO_TEST_DEVICE", "cpu") == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"
