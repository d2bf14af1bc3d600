"""Corpus, query, qrels and QA readers; ingest to Parquet + manifest."""
