"""The ledger's Alembic revisions (``versions/``), applied by ``ledger.schema`` on open.

No ``env.py``: ``ledger.schema`` runs them on the ``Ledger``'s own connection. A schema change
is a new revision in ``versions/`` (copy the newest, point ``down_revision`` at it); a released
revision is never edited.
"""
