"""gshard_mt: GShard-style Mixture-of-Experts Transformers for many-to-English translation."""
