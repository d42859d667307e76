"""The bundled toy models: small Qwen3s trained in this repo (``bosch_eval.toy.train``)
to need both local and long-range heads. Their cards are ``model/README.md`` (``toy``) and
``model_l/README.md`` (``toy-l``). Their aliases (``toy``, ``toy-l``) and the resolver every
command uses live in :mod:`bosch_eval.models.model_check` (``BUNDLED_MODELS``, ``model_path``,
``resolve_model``), below the toy's training code, so that tasks and search need not import it."""
