"""The MoE engine: embedding, parsing and chunking (router and experts come later).

`engine` imports neither FastAPI nor SQLAlchemy; `app` drives it.
"""
