"""Review (admins): each annotator's progress and reliability, agreement between annotators,
disagreements to look at, exclusion of test/practice annotators or single judgments from every
metric, second reading of outlines (photos marked here, Dice beside the triplet κ), and the audit trail
of who changed what.

One function per tab (:func:`app.review.main` draws them); the tables' rows come from UI-free functions
(:func:`annotations.scheduling.consistency.annotator_rows`, :func:`annotations.followup.readings.photo_rows`,
:func:`annotations.store.history.audit_rows`)."""

from __future__ import annotations

from app import auth, navigation, review

ws = navigation.page("Review", need="manage")
review.main(ws, auth.actor())
