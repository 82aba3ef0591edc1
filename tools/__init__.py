"""Long-running tools (crash torture, profiles): each is also a script, ``python tools/NAME.py``;
the tests import them from here."""
