"""``python -m granary.analyze SCRIPT.py``: the stall report of SCRIPT.py's ``loader()``
and ``step(batch)``."""
import sys

from .._stall import main

sys.exit(main())
