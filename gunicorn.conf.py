"""The scheduler daemon: `.venv/bin/gunicorn -c gunicorn.conf.py` is the whole start command.

Every setting lives in tiny_scheduler/server/gunicorn_conf.py, so the installed package
(`tiny-scheduler serve`) and a checkout run exactly the same daemon.
"""

from tiny_scheduler.server.gunicorn_conf import *  # noqa: F403
