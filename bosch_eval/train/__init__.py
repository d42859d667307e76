"""Continual pretraining of a hybrid (full/SWA) model with its head mask fixed:
``bosch-eval train`` (paper Appendix B.5). ``data`` packs text into fixed-length
sequences, ``trainer`` runs the Accelerate loop and writes the hybrid checkpoint."""
