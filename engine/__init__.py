"""The MoE engine: parsing and chunking, embedding, the gate (router and its training), the ask
flow over one serving state (expert path or fallback), BM25 and the generators.

`engine` imports neither FastAPI nor SQLAlchemy; `app` drives it.
"""
