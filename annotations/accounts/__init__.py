"""People: accounts, roles and signed sessions, the page-independent session logic behind the app, and
privacy (study ids, erasing a patient).
"""
