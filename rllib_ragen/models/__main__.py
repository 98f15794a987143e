"""`python -m rllib_ragen.models list` / `pull NAME` (also `rllib-ragen models`)."""

import sys

from rllib_ragen.models.models_cli import main

sys.exit(main())
