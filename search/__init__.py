"""Head-mask builders and the BOSCH search (installed as ``bosch_eval.search``)."""
