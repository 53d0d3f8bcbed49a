"""Is my job stalled? ``granary.analyze(loader, step)`` (the function, which the package
exports under this name) and ``python -m granary.analyze SCRIPT.py``; the work is in
``granary._stall``."""
from .._stall import StallReport, analyze, main

__all__ = ["StallReport", "analyze", "main"]
