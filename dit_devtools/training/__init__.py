"""How ``tiny-flux-shapes`` was made: its scene grammar (``shapes_dataset``), parts (``shapes_model``),
training (``train_tiny_flux_shapes``: stage 1) and fine-tuning (``finetune_tiny_flux_shapes``: stages 2
and 3), and its evaluation by a colour/shape detector (``shapes_detector``, ``shapes_eval``). The trained
weights ship with the engine under ``parallel_runtime/models/trained/``."""
