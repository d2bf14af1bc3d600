"""The search settings of an index (IndexConfig's nprobe and ef_search): what `pipeline index` keeps in the index
file (FAISS writes nprobe and efSearch with it) and records in index.json, and what a search given its own sets."""

from __future__ import annotations

from ..config import IndexConfig
from ..errors import ConfigError


# the search settings of IndexConfig, by FAISS's ParameterSpace name
SEARCH_PARAMS = (("nprobe", "nprobe"), ("ef_search", "efSearch"))


def search_settings(cfg: IndexConfig) -> dict:
    """The search settings `cfg` asks for ({} when none): what `pipeline index` stores in the index (FAISS keeps
    nprobe and efSearch in the file) and records in index.json, and what a search given them sets."""
    return {key: getattr(cfg, key) for key, _ in SEARCH_PARAMS if getattr(cfg, key)}


def set_search_params(index, cfg: IndexConfig | None, factory: str | None = None) -> None:
    """Set `cfg`'s nprobe / ef_search on `index` (those not asked for stay as the index holds them: as it was built,
    or FAISS's default). One the index has none of (nprobe on a Flat or HNSW index, ef_search on an IVF one) is a
    ConfigError naming the key, never ignored."""
    if cfg is None:
        return
    import faiss

    params = faiss.ParameterSpace()
    for key, name in SEARCH_PARAMS:
        value = getattr(cfg, key)
        if not value:
            continue
        try:
            params.set_index_parameter(index, name, value)
        except RuntimeError:
            kind = factory or type(faiss.downcast_index(index)).__name__
            has = "IVF indexes" if key == "nprobe" else "HNSW indexes"
            raise ConfigError(f"index.{key}={value}: the {kind} index has no {name} (only {has} do); leave index.{key} "
                              "unset for it") from None


def said(cfg: IndexConfig) -> str:
    """The search settings for a build's done line: ", searched with nprobe 64 unless a search sets its own", or ""."""
    asked = search_settings(cfg)
    if not asked:
        return ""
    return ", searched with " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in asked.items()) + \
        " unless a search sets its own"
