"""The search as a whole: its pipeline of stages, cost model, report and the model-level entry (``api``)."""
