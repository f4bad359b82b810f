"""The encoder-decoder Transformer: `layers` (attention, dense FFN, masks) and `transformer` (the model)."""
