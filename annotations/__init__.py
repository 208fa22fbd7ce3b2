"""The human-input domain of TriDerm Studio, one subpackage per concern: ``store`` (the SQLite store and its
named queries), ``io`` (dataset import/export, readers, other tools' formats), ``accounts`` (accounts,
sessions, privacy), ``followup`` (visits, measurement, second readings), ``scheduling`` (triplets, agreement)
and ``infra`` (files, jobs, the workspace, backup). No torch and no Streamlit here."""
