"""The search's journal on disk: every finished S(z) before the next starts (``journal``), and what a journal pins against the run that opens it (``journal_header``)."""
