"""Models, core (docs/architecture.md#layers): finding, checking, describing and writing them.

``model_check`` (the one model resolver, the bundled toy models' aliases, config checks
before weights load), ``model_defaults`` (``bosch_defaults.json``),
``gguf_models`` (a GGUF file converted once into a cached checkpoint), ``model_identity``
(what a model is, for pins: an alias and file hashes, never a path), ``checkpoint`` (the
mask inside ``config.json``), ``export`` (plain transformers checkpoints, ``bosch-serving/1``),
``rope_scaling`` (YaRN), ``random_model`` (tiny random decoders for tests and benchmarks),
``transformers_compat`` (names that differ between supported transformers releases).
"""
