"""FAISS store whose inverted lists are the clusters experts own. A leaf package."""

from index.clustering import auto_cluster_count, kmeans
from index.store import Ask, ClusteredIndex, IndexCorrupt, SearchIndex

__all__ = ["Ask", "ClusteredIndex", "IndexCorrupt", "SearchIndex", "auto_cluster_count", "kmeans"]
