"""`python -m fisk_sm.cli`."""

import sys

from fisk_sm.cli.main import main

sys.exit(main())
