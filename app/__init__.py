"""The app's package under ``app.py`` and ``pages/``: the parts every page shares (auth, navigation, images,
jobs, extras, markup) and each page's logic (a page script only wires its widgets to functions here).

Importing it installs the missing-extra guard (:class:`app.extras.MissingExtra`)."""

from app import extras
