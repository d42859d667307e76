"""lm-eval model adapters (installed as ``bosch_eval.model_adapters``) and the start-up hook
that registers them with lm-eval (``lm_eval_hook``).

Importing this package imports nothing: the ``.pth`` start-up line imports the hook in it
at every interpreter start.
"""
