"""bosch-eval: hybrid full/sliding-window attention heads, chosen by black-box search.

Importing this package is cheap on purpose (the lm-eval start-up hook lives in it):
torch, transformers and lm-eval are imported by the submodules that need them.
"""

__version__ = "0.1.0"
