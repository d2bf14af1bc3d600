"""Ray-distributed training and indexing pipeline for dense retrieval."""

__version__ = "0.3.0"
