"""The human-input domain of TriDerm Studio: the SQLite store, dataset import/export and
triplet scheduling. No torch and no Streamlit here."""
