"""The data layer: the SQLite store and its named queries, the run kinds and the revision history.

``store`` (the :class:`~annotations.store.store.Store`: connection, schema, photos, wounds, judgments), which
composes ``run_records`` (the run records) and ``revisions`` (the revisions table, edits from a loaded copy,
import bases); ``rows`` (the row values both use: timestamps, natural keys, JSON columns); ``runs`` (the run
kinds and ``recording()``); ``history`` (reading and restoring the revisions).
"""
