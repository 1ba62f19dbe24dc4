"""Toy files a user would otherwise download: small Hugging Face checkpoints (``checkpoint``), a
character-level tokenizer trained with ``tokenizers`` (``tokenizer``) and toy datasets (``tasks``).
``tools/make_toy_files.py`` writes all three into one directory."""
