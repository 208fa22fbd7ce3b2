"""Streamlit components shipped with the app (the outline editor)."""
