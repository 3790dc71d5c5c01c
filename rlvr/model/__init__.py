"""Models and tokenizers: the tiny default (tokenizer, Llama config), loading any HF causal-LM
directory, and atomic checkpoints."""
