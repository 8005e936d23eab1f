"""`python -m octopus_audio`: the same as the `octopus-audio` command."""

import sys

from octopus_audio.cli import main

sys.exit(main())
