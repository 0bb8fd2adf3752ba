"""A GPT-2-style causal language model from HF transformers (random init) on synthetic tokens."""
