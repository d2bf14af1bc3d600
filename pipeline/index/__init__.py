"""Ray Data encoding into embedding shards, FAISS indexes, retrieval to TREC runs."""
