"""Fixtures of the page tests: logged-in test clients, the token REST client of the same operator (autouse: no
real master or broker reached, fresh cache)."""
from tests.support.registry import api, operator, viewer
from tests.support.ui import _isolated, ui, viewer_ui
