"""The data layer: the SQLite store and its named queries, the run kinds and the revision history.

``store`` (the :class:`~annotations.store.store.Store`: connection, schema, photos, wounds, judgments), which
composes ``run_records`` (the run records), ``revisions`` (the revisions table, edits from a loaded copy,
import bases), ``readings`` (the second readings' rows), ``erasure`` (a patient's rows erased), ``accounts`` (the
accounts, the exclusions from evaluation, a free-text annotator's judgments moved to an account), ``leases``
(the scheduler's reads of the judgments, its lease file and the leases of erased photos) and ``imports`` (a
dataset's judgments in a temporary file, the re-import merge's and the export's queries); ``rows``
(the row values they use: timestamps, natural keys, JSON columns); ``snapshots`` (a backup's online copy of the
store, a restore's checks of a copy: integrity, schema); ``runs`` (the run kinds and ``recording()``);
``history`` (reading and restoring the revisions).
"""
