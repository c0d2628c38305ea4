"""``python -m trainplan``: the command line."""
import sys

from trainplan.cli import main

sys.exit(main())
