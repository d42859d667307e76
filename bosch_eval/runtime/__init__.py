"""Process plumbing, core (docs/architecture.md#layers): what every command and the adapter run on.

lm-eval: ``lm_eval_session`` (task loading, seeding, reversible patches around repeated
``evaluate`` calls, metric helpers), ``lm_eval_logs``, ``nltk_offline`` (RULER's nltk download, offline),
``doc_selection`` (which documents a limit keeps, per length). Processes: ``launch`` (the
processes of an ``accelerate launch``), ``threads`` (the thread counts, decided once),
``device``, ``outdir_lock`` (one run per output directory), ``previous_results`` (a finished
result kept aside before new settings replace it). Shared by every layer: ``registry``
(every family of interchangeable parts by name), ``errors`` (every error class), ``checks``,
``digests``, ``versions``. The bottom of the core: it imports no other folder of the package.

Importing this package imports nothing: the lm-eval start-up hook imports ``errors`` from it
in the ``lm_eval`` command.
"""
