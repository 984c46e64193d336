"""The HTTP server plumbing under gunicorn: the daemon's settings and start-up checks, its
worker (connections read and written in one event loop, plain requests on a C parser,
answers given in the loop, requests parked until something happens), and the command that
starts it. The API and the service know only `inline` and `waiting`: the two ways a view
tells the loop what it needs.
"""
