"""`python -m rllib_ragen COMMAND ...`: the `rllib-ragen` command line without its console script."""

import sys

from rllib_ragen.cli import main

sys.exit(main())
