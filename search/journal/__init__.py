"""The search's journal on disk: every finished S(z) before the next starts (``store``), and what a journal pins against the run that opens it (``header``)."""
