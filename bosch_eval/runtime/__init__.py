"""Process plumbing, core (docs/architecture.md#layers): what every command and the adapter run on.

lm-eval: ``lm_eval_session`` (task loading, seeding, reversible patches around repeated
``evaluate`` calls, metric helpers), ``lm_eval_hook`` (the start-up hook that registers
``bosch`` and our tasks), ``lm_eval_logs``, ``nltk_offline`` (RULER's nltk download, offline),
``doc_selection`` (which documents a limit keeps, per length). Processes: ``launch`` (the
processes of an ``accelerate launch``), ``threads`` (the thread counts, decided once),
``device``, ``outdir_lock`` (one run per output directory), ``previous_results`` (a finished
result kept aside before new settings replace it). Shared by every layer: ``registry``
(every family of interchangeable parts by name), ``errors`` (``BoschError``), ``versions``.

Importing this package imports nothing: the start-up hook lives in it.
"""
