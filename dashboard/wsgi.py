"""WSGI entry point (``gunicorn dashboard.wsgi``).

Unusable settings (``DJANGO_SECRET_KEY`` unset, a malformed variable) print one line, ``Error: improperly
configured: …``, and stop the worker (``dashboard.env.load_settings_or_exit``), which stops gunicorn.
"""
import os

from django.core.wsgi import get_wsgi_application

from dashboard.env import load_settings_or_exit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dashboard.settings")
load_settings_or_exit()
application = get_wsgi_application()
